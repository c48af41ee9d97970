# bufscope .rpm %post ($1: 1 first install, 2 or more an upgrade). As the .deb: the user, the
# pin directory, daemon-reload; an upgrade restarts a running bufscope (it adopts its pinned
# maps and links: counting continues). A first install enables and starts nothing.
if command -v systemd-sysusers >/dev/null 2>&1; then
    systemd-sysusers bufscope.conf || :
fi
if ! getent passwd bufscope >/dev/null; then
    getent group bufscope >/dev/null || groupadd -r bufscope
    useradd -r -g bufscope -d / -s /sbin/nologin -c "bufscope eBPF exporter" bufscope
fi
if [ -d /run/systemd/system ]; then
    systemd-tmpfiles --create bufscope.conf >/dev/null 2>&1 || :
    systemctl daemon-reload >/dev/null 2>&1 || :
    if [ "$1" -ge 2 ]; then
        systemctl try-restart bufscope.service >/dev/null 2>&1 || :
    fi
fi
