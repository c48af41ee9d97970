# bufscope-tunnel .rpm %preun ($1: 0 erase): stop every instance.
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
    systemctl stop 'bufscope-tunnel@*.service' >/dev/null 2>&1 || :
fi
