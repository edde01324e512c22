//! The book's configuration reference (`docs/configuration.md`) and route file keys
//! (`docs/guide/proxy.md`) are generated from the clap definitions and the parser; these
//! tests fail when they drift apart, and print the table to paste.

use clap::CommandFactory;
use idem_origin::config::Config;

fn reference_table() -> String {
    let mut out = String::from("| flag | environment | default | meaning |\n|---|---|---|---|\n");
    for arg in Config::command().get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" || long == "version" {
            continue;
        }
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let default = arg
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(", ");
        let mut help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        if !help.is_empty() && !help.ends_with('.') {
            help.push('.');
        }
        let values: Vec<String> = arg
            .get_possible_values()
            .iter()
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        if !values.is_empty() {
            help.push_str(&format!(" One of {}.", values.join(", ")));
        }
        let help = outside_code(&help);
        out.push_str(&format!("| `--{long}` | {env} | {default} | {help} |\n"));
    }
    out
}

/// `text` with `<` and `>` outside code spans written as entities: `jwt:<claim>` in
/// prose is otherwise an HTML tag, which GitHub and mdBook render as nothing.
fn outside_code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                out.push(c);
            }
            '<' if !in_code => out.push_str("&lt;"),
            '>' if !in_code => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

/// Fails unless the book's `page` (under `docs/`) holds `expected` between
/// `<!-- {marker}:start -->` and `<!-- {marker}:end -->`, and prints it to paste.
fn book_holds(page: &str, marker: &str, what: &str, expected: &str) {
    let path = format!("{}/../docs/{page}", env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(&path).unwrap();
    let (open, close) = (
        format!("<!-- {marker}:start -->\n"),
        format!("<!-- {marker}:end -->"),
    );
    let start = readme
        .find(&open)
        .unwrap_or_else(|| panic!("docs/{page} has no {open}"))
        + open.len();
    let end = readme
        .find(&close)
        .unwrap_or_else(|| panic!("docs/{page} has no {close}"));
    assert!(
        readme[start..end] == *expected,
        "docs/{page}'s {what} is out of date; replace it with:\n\n{expected}"
    );
}

#[test]
fn the_configuration_reference_matches_the_cli() {
    book_holds(
        "configuration.md",
        "config",
        "configuration reference",
        &reference_table(),
    );
}

/// The route file's keys as the book shows them.
fn route_keys_table() -> String {
    let mut out = String::from("| key | example | meaning |\n|---|---|---|\n");
    for (key, example, meaning) in idem_origin::routes::ROUTE_KEYS {
        out.push_str(&format!("| `{key}` | `{example}` | {meaning} |\n"));
    }
    out
}

#[test]
fn the_route_file_reference_matches_the_parser() {
    book_holds(
        "guide/proxy.md",
        "routes",
        "route file reference",
        &route_keys_table(),
    );
}

/// Every variable compose.yaml gives the origin is one `idem-origin` reads.
#[test]
fn compose_sets_only_variables_the_origin_reads() {
    let compose =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../compose.yaml")).unwrap();
    let known: Vec<String> = Config::command()
        .get_arguments()
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    let set: Vec<&str> = compose
        .lines()
        .filter_map(|l| l.trim().split_once(':').map(|(k, _)| k))
        .filter(|k| k.starts_with("IDEM_") || *k == "DATABASE_URL")
        .collect();
    assert!(set.len() >= 10, "compose.yaml's origins: {set:?}");
    for name in set {
        assert!(
            known.iter().any(|k| k == name),
            "compose.yaml sets {name}, which idem-origin does not read"
        );
    }
}
