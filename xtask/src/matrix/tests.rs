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
