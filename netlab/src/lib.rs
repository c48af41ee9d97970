//! Network lab: namespaces joined by a userspace WAN emulator (see issue 5).
