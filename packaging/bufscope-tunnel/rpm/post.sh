# bufscope-tunnel .rpm %post ($1: 1 first install, 2 or more an upgrade): /etc/bufscope-tunnel
# (mode 0700: the configurations hold private keys); an upgrade restarts running instances.
install -d -m 0700 /etc/bufscope-tunnel
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 2 ]; then
        systemctl try-restart 'bufscope-tunnel@*.service' >/dev/null 2>&1 || :
    fi
fi
