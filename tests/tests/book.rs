//! The book (`docs/`) and the README hold together: every relative link resolves to a
//! file, and every `#anchor` to a heading of the page it names (as GitHub and mdBook
//! spell headings' ids); every chapter is in `SUMMARY.md`; the README stays a front
//! door. Needs no service; `scripts/test` also builds the book with mdBook.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 400;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Markdown pages: README, CHANGELOG and every `.md` under `docs/`.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    walk(&root().join("docs"), &mut out);
    out
}

/// The page's lines outside fenced code blocks, with inline code spans blanked (a
/// link or a heading inside code is text).
fn prose(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut kept = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                kept.push(c);
            } else if !in_code {
                kept.push(c);
            }
        }
        out.push(kept);
    }
    out
}

/// A heading's id as GitHub and mdBook make it: lower case, letters, digits, `-` and
/// `_` kept, spaces as `-`, everything else dropped; repeats numbered `-1`, `-2`, ….
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The ids a page's headings (and explicit `id="…"` anchors) give.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            if heading.starts_with(' ') {
                let base = slug(&heading.replace('`', ""));
                let n = seen.entry(base.clone()).or_insert(0);
                out.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
        }
        for (i, _) in line.match_indices("id=\"") {
            let rest = &line[i + 4..];
            if let Some(end) = rest.find('"') {
                out.insert(rest[..end].to_owned());
            }
        }
    }
    out
}

/// The targets of the page's inline links and images: `[text](target)`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push(target.to_owned());
            rest = &after[end..];
        }
    }
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_link_of_the_book_and_the_readme_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.is_empty()
                || target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let linked = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !linked.exists() {
                broken.push(format!("{}: {target}: no such file", relative(&page)));
                continue;
            }
            if let Some(anchor) = anchor {
                if linked.extension().is_some_and(|e| e == "md") {
                    let ids = anchors(&std::fs::read_to_string(&linked).unwrap());
                    if !ids.contains(anchor) {
                        broken.push(format!(
                            "{}: {target}: {} has no heading #{anchor}",
                            relative(&page),
                            relative(&linked)
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the parser reading the pages?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_chapter_is_in_the_summary() {
    let docs = root().join("docs");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = links(&summary)
        .iter()
        .map(|target| docs.join(target))
        .collect();
    for chapter in &listed {
        assert!(
            chapter.exists(),
            "SUMMARY.md names {}, missing",
            relative(chapter)
        );
    }
    let orphans: Vec<String> = pages()
        .into_iter()
        .filter(|page| page.starts_with(&docs) && !page.ends_with("SUMMARY.md"))
        .filter(|page| !listed.contains(page))
        .map(|page| relative(&page))
        .collect();
    assert!(
        orphans.is_empty(),
        "chapters not in docs/SUMMARY.md: {orphans:?}"
    );
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; the rest belongs in the book (docs/), at most {README_MAX_LINES}"
    );
    for heading in [
        "## Quick start: the library",
        "## Stores",
        "## The HTTP contract",
    ] {
        assert!(readme.contains(heading), "README.md lost {heading:?}");
    }
}

#[test]
fn headings_slug_as_github_does() {
    assert_eq!(
        slug("Against the idempotent crate, and where the µs go"),
        "against-the-idempotent-crate-and-where-the-µs-go"
    );
    assert_eq!(
        slug("Put idem in front of your API (proxy mode)"),
        "put-idem-in-front-of-your-api-proxy-mode"
    );
    let ids = anchors("# A\n## A\n```\n# not a heading\n```\n<a id=\"x\"></a>\n");
    assert_eq!(
        ids,
        ["a", "a-1", "x"].into_iter().map(String::from).collect()
    );
}
