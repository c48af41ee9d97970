//! Reads the JUnit report cargo-nextest writes (`target/nextest/<profile>/junit.xml`): one
//! [`Suite`] per test binary (nextest's binary id: `bufscope`, `bufscope::bin/bufscope`,
//! `bufscope-integration::guard`) with each test's name, seconds and whether it failed.
//!
//! Only the shape nextest writes is read (elements, attributes in double quotes, the five
//! predefined entities and numeric references); nothing else needs an XML library here.

/// One test case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// The test's name (`tests::keeps_limit`).
    pub name: String,
    /// Its wall seconds.
    pub secs: f64,
    /// It failed (a `<failure>` or `<error>` child: an assertion, a crash, a timeout).
    pub failed: bool,
}

/// One test binary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Suite {
    /// nextest's binary id.
    pub name: String,
    /// Its tests in the order of the report.
    pub cases: Vec<Case>,
}

/// The suites of a report, in order.
pub fn parse(xml: &str) -> anyhow::Result<Vec<Suite>> {
    let mut suites: Vec<Suite> = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest
            .find('>')
            .ok_or_else(|| anyhow::anyhow!("junit: an unclosed tag"))?;
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if tag.starts_with('?') || tag.starts_with('!') || tag.starts_with('/') {
            continue;
        }
        let name = tag
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap_or_default();
        match name {
            "testsuite" => suites.push(Suite {
                name: attr(tag, "name").unwrap_or_default(),
                cases: Vec::new(),
            }),
            "testcase" => {
                let suite = suites
                    .last_mut()
                    .ok_or_else(|| anyhow::anyhow!("junit: a testcase outside a testsuite"))?;
                suite.cases.push(Case {
                    name: attr(tag, "name").unwrap_or_default(),
                    secs: attr(tag, "time")
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0.0),
                    failed: false,
                });
            }
            "failure" | "error" => {
                if let Some(c) = suites.last_mut().and_then(|s| s.cases.last_mut()) {
                    c.failed = true;
                }
            }
            _ => {}
        }
    }
    Ok(suites)
}

/// The value of `key="…"` in a tag's text, unescaped.
fn attr(tag: &str, key: &str) -> Option<String> {
    let pat = format!(" {key}=\"");
    let start = tag.find(&pat)? + pat.len();
    let len = tag[start..].find('"')?;
    Some(unescape(&tag[start..start + len]))
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let Some(end) = rest.find(';') else {
            break;
        };
        let ent = &rest[1..end];
        let ch = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => ent
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of a report cargo-nextest 0.9.143 wrote, with a failed and a timed-out test.
    const REPORT: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="4" skipped="0" failures="2" errors="0" time="61.0">
    <testsuite name="bufscope-api" tests="1" skipped="0" errors="0" failures="0">
        <testcase name="status::tests::keys_and_shapes" classname="bufscope-api" timestamp="2026-12-06T02:45:44.874+00:00" time="0.007"/>
    </testsuite>
    <testsuite name="bufscope-integration::guard" tests="3" skipped="0" errors="0" failures="2">
        <testcase name="keeps_limit" classname="bufscope-integration::guard" time="4.500">
            <failure type="test failure with exit code 101" message="assertion `left == right` failed &amp; &lt;more&gt;">thread &apos;keeps_limit&apos; panicked</failure>
            <system-out>x &#60; y</system-out>
        </testcase>
        <testcase name="a::waits" classname="bufscope-integration::guard" time="300.001">
            <failure type="test timeout"/>
        </testcase>
        <testcase name="refuses &quot;bad&quot; port" classname="bufscope-integration::guard" time="0.25"/>
    </testsuite>
</testsuites>
"#;

    #[test]
    fn reads_suites_cases_times_and_failures() {
        let s = parse(REPORT).unwrap_or_default();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "bufscope-api");
        assert_eq!(
            s[0].cases,
            [Case {
                name: "status::tests::keys_and_shapes".into(),
                secs: 0.007,
                failed: false
            }]
        );
        let g: Vec<(&str, f64, bool)> = s[1]
            .cases
            .iter()
            .map(|c| (c.name.as_str(), c.secs, c.failed))
            .collect();
        assert_eq!(
            g,
            [
                ("keeps_limit", 4.5, true),
                ("a::waits", 300.001, true),
                ("refuses \"bad\" port", 0.25, false)
            ]
        );
    }

    #[test]
    fn entities_are_unescaped() {
        assert_eq!(
            unescape("a &amp; b &lt;&gt; &#60;&#x3e; &bogus; &"),
            "a & b <> <> &bogus; &"
        );
    }
}
