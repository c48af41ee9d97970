# bufscope .rpm %postun ($1: 0 erase, 1 or more an upgrade). RPM has no purge: an erase removes
# what the .deb's purge removes (the pins and the user); rpm itself removes the configuration
# unless it was edited (then kept as /etc/bufscope/bufscope.yaml.rpmsave).
if [ "$1" -eq 0 ]; then
    pins=/sys/fs/bpf/bufscope
    # Unlinking the pins releases the links and maps: the programs detach and are unloaded.
    if [ -d "$pins" ] && [ "$(stat -f -c %t "$pins" 2>/dev/null)" = cafe4a11 ]; then
        rm -rf "$pins"
    fi
    if getent passwd bufscope >/dev/null; then
        userdel bufscope >/dev/null 2>&1 || :
    fi
    if getent group bufscope >/dev/null; then
        groupdel bufscope >/dev/null 2>&1 || :
    fi
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload >/dev/null 2>&1 || :
    fi
fi
