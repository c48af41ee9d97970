# bufscope-tunnel .rpm %postun ($1: 0 erase): the instances' enablement links go, and
# /etc/bufscope-tunnel when empty (configurations hold the operator's private keys: kept).
if [ "$1" -eq 0 ]; then
    find /etc/systemd/system -name 'bufscope-tunnel@*.service' -type l -delete 2>/dev/null || :
    rmdir /etc/bufscope-tunnel 2>/dev/null || :
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
