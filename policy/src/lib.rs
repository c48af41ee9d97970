//! The recommended socket-buffer policy (see issue 5).
