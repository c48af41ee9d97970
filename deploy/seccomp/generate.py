#!/usr/bin/env python3
"""Write deploy/seccomp/bufscope.json: a container engine's default seccomp profile, resolved for
the capabilities the DaemonSet grants, plus bpf(2) and perf_event_open(2).

    python3 deploy/seccomp/generate.py /usr/share/containers/seccomp.json \\
        --caps BPF,PERFMON,SYS_PTRACE,DAC_READ_SEARCH,NET_ADMIN > deploy/seccomp/bufscope.json

The input is the engine's profile in the Docker/containers-common format, whose rules may hold
capability conditions (`includes.caps`: only with all of these, `excludes.caps`: only without
any of these). containerd reads a Localhost profile as an OCI `LinuxSeccomp` and ignores those
conditions, so a conditional profile would allow there what is meant for CAP_SYS_ADMIN only.
The output therefore has no capability conditions: each rule is kept or dropped for exactly
the capabilities given (the DaemonSet's), which means the same under containerd, CRI-O and
Podman. Architecture conditions stay (containerd ignores them too; the syscalls they name
exist only on those architectures). bpf and perf_event_open are removed from every rule that
denies them and allowed unconditionally: the kernel still checks CAP_BPF/CAP_PERFMON.
Syscalls bufscope never makes that would read or write another process's memory or open
files by handle (open_by_handle_at, ptrace, process_vm_readv/writev: the engine allows the
last three with CAP_SYS_PTRACE, which the DaemonSet holds only to read /proc/<pid>/fd) are
removed from every rule, so the default action denies them.

integration/tests/image.rs regenerates the file from the engine's default and fails if the
committed one differs.
"""

import argparse
import json
import sys

ADDED = ["bpf", "perf_event_open"]
DENIED = ["open_by_handle_at", "ptrace", "process_vm_readv", "process_vm_writev"]


def applies(rule, caps):
    inc = (rule.get("includes") or {}).get("caps") or []
    exc = (rule.get("excludes") or {}).get("caps") or []
    return all(c in caps for c in inc) and not any(c in caps for c in exc)


def without_caps(cond):
    return {k: v for k, v in (cond or {}).items() if k != "caps" and v}


def resolve(profile, caps):
    rules = []
    for rule in profile.get("syscalls") or []:
        if not applies(rule, caps):
            continue
        names = rule.get("names") or ([rule["name"]] if rule.get("name") else [])
        if rule.get("action") != "SCMP_ACT_ALLOW" or rule.get("args"):
            names = [n for n in names if n not in ADDED]
        names = [n for n in names if n not in DENIED]
        if not names:
            continue
        out = {k: v for k, v in rule.items() if k not in ("name", "names", "includes", "excludes")}
        out = {"names": names, **out}
        for side in ("includes", "excludes"):
            cond = without_caps(rule.get(side))
            if cond:
                out[side] = cond
        rules.append(out)
    rules.append(
        {
            "names": ADDED,
            "action": "SCMP_ACT_ALLOW",
            "comment": "bufscope: load BPF programs and maps (CAP_BPF) and attach tracepoints "
            "(CAP_PERFMON); the kernel checks both capabilities",
        }
    )
    head = {k: v for k, v in profile.items() if k != "syscalls"}
    return {**head, "syscalls": rules}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", help="the engine's default profile (Docker/containers-common JSON)")
    ap.add_argument("--caps", required=True, help="comma-separated capabilities, e.g. BPF,PERFMON")
    a = ap.parse_args()
    caps = {c if c.startswith("CAP_") else "CAP_" + c for c in a.caps.upper().split(",") if c}
    with open(a.profile, encoding="utf-8") as f:
        profile = json.load(f)
    json.dump(resolve(profile, caps), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
