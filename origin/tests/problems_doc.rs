//! Every problem type idem answers with points at a section of `docs/problems.md`: one
//! section per problem, named as the type ends, and no section that names no problem.

use idem_core::contract::{Problem, DEFAULT_PROBLEM_BASE};

fn sections() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/problems.md"))
        .expect("docs/problems.md");
    let mut out: Vec<(String, String)> = Vec::new();
    for line in doc.lines() {
        if let Some(name) = line.strip_prefix("## ") {
            out.push((name.trim().to_owned(), String::new()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    out
}

#[test]
fn every_problem_has_its_section_and_every_section_a_problem() {
    let sections = sections();
    let mut expected: Vec<(String, u16)> = Problem::ALL
        .iter()
        .map(|p| (p.slug().to_owned(), p.status()))
        .collect();
    // The admin API's: their statuses are in their sections too.
    for kind in idem::admin::ADMIN_PROBLEM_KINDS {
        expected.push((format!("admin-{kind}"), 0));
    }
    for (name, status) in &expected {
        let section = sections.iter().find(|(n, _)| n == name);
        let Some((_, text)) = section else {
            panic!("docs/problems.md has no section `## {name}`");
        };
        assert!(
            text.split_whitespace().count() >= 12,
            "the section `{name}` says too little"
        );
        if *status != 0 {
            assert!(
                text.contains(&format!("**{status}")),
                "the section `{name}` does not give its status {status}"
            );
        }
    }
    for (name, _) in &sections {
        assert!(
            expected.iter().any(|(n, _)| n == name),
            "docs/problems.md's section `{name}` names no problem"
        );
    }
    assert_eq!(sections.len(), expected.len(), "a section is repeated");
    // The default type of each problem is its section's address on GitHub.
    assert!(DEFAULT_PROBLEM_BASE.ends_with("docs/problems.md#"));
    assert_eq!(
        Problem::InFlight.type_uri(),
        format!("{DEFAULT_PROBLEM_BASE}request-in-flight")
    );
}
