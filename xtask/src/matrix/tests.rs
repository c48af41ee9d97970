//! Step and kernel selection of the matrix.

use super::steps::STEPS;
use super::*;

#[test]
fn a_steps_full_name_reruns_that_step_alone() {
    for st in STEPS {
        let got = selected_steps(&[st.name.to_string()])
            .map(|v| v.iter().map(|s| s.name).collect::<Vec<_>>());
        assert_eq!(got.ok(), Some(vec![st.name]), "--step {:?}", st.name);
    }
    assert_eq!(selected_steps(&[]).map(|v| v.len()).ok(), Some(STEPS.len()));
    assert!(selected_steps(&["no such step".into()]).is_err());
    assert!(selected_pins(&["no such kernel".into()]).is_err());
    assert_eq!(
        rerun("6.1", Some("TCP lock")),
        "cargo xtask matrix --kernel 6.1 --step 'TCP lock'"
    );
}

/// A probe no variant of which this kernel's BTF allows: offline says so ("no variant is
/// usable"), the guest names the variant it passed over and fails it; both agree. Offline
/// "none usable" with a guest that attached something is a disagreement.
#[test]
fn no_usable_variant_offline_agrees_with_a_guest_that_could_not_attach() {
    let line = |ok: &str| {
        vec![
            "probes:".to_string(),
            format!("[{ok}] drops                  tp_btf/kfree_skb — drops: attached"),
            format!(
                "[{ok}] wireguard              tp_btf/consume_skb — kernel WireGuard's drops: no variant attached"
            ),
        ]
    };
    let offline = vec![
        ("drops".to_string(), "tp_btf/kfree_skb".to_string()),
        ("wireguard".to_string(), "no".to_string()),
    ];
    let run = |check: Vec<String>| GuestRun {
        check,
        check_rc: Some(0),
        ended: true,
        ..GuestRun::default()
    };
    let mut out = Outcome {
        steps: Vec::new(),
        failures: Vec::new(),
        kernel_secs: Vec::new(),
    };
    let mut failed = line(" ok ");
    failed[2] = failed[2].replace("[ ok ]", "[FAIL]");
    judge("6.1", &run(failed), &offline, 0, &mut out);
    assert!(
        !out.failures.iter().any(|(f, _)| f.contains("wireguard")),
        "{:?}",
        out.failures
    );
    let mut out = Outcome {
        steps: Vec::new(),
        failures: Vec::new(),
        kernel_secs: Vec::new(),
    };
    judge("6.1", &run(line(" ok ")), &offline, 0, &mut out);
    assert!(
        out.failures.iter().any(|(f, _)| f.contains("wireguard")),
        "{:?}",
        out.failures
    );
}
