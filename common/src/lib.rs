//! Types shared by the BPF programs (`bufscope-ebpf`) and userspace (`bufscope`).
#![no_std]
