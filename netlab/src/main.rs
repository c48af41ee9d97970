//! `netlab`: open a shell-ready WAN lab, list or clean up leftovers.

fn main() {}
