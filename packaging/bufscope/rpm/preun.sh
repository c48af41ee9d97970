# bufscope .rpm %preun ($1: 0 erase, 1 or more an upgrade): on erase, stop and disable the
# service. An upgrade leaves it running (%post of the new package restarted it already).
if [ "$1" -eq 0 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl --no-reload disable --now bufscope.service >/dev/null 2>&1 || :
    else
        systemctl --no-reload disable bufscope.service >/dev/null 2>&1 || :
    fi
fi
