//! Each script is sent to Redis with only the functions of `layout.lua` it calls,
//! directly or through another. Redis runs a script's whole text on every call, and
//! each `local function` in it makes a closure anew each time: the ten functions of
//! the layout cost a claim 0.7–0.9 µs of Redis' time (`redis-benchmark`, `EVALSHA` of
//! the claim script with and without them), about an eighth of the script.
//!
//! `layout.lua` is a sequence of blocks, each its comment lines and one
//! `local function name(…)` ending at a line `end`; a block whose comment says
//! `[string layout]` or `[hash layout]` is one layout's only. Blocks keep their order,
//! so a function is defined before any that calls it, as Lua's locals need.

use super::RedisLayout;

const LAYOUT: &str = include_str!("layout.lua");

/// One function of the layout, with the comment before it.
struct Block<'a> {
    name: &'a str,
    only: Option<RedisLayout>,
    text: &'a str,
}

/// The layout's blocks, in order. Panics on text that is not a block — a line outside
/// a function that is not a comment, a function opened inside another, a name that is
/// not an identifier, a function on one line — rather than lose a function silently:
/// `layout.lua` is part of this crate, and the tests link every script.
fn blocks() -> Vec<Block<'static>> {
    let mut blocks = Vec::new();
    let mut start = 0;
    let mut at = 0;
    let mut open: Option<&str> = None;
    for line in LAYOUT.split_inclusive('\n') {
        let end = at + line.len();
        let bare = line.trim_end();
        let opens = bare.strip_prefix("local function ");
        match (open, opens) {
            (None, None) if bare.starts_with("--") => {}
            (None, Some(rest)) => {
                let name = rest
                    .split_once('(')
                    .map(|(name, _)| name)
                    .filter(|name| is_identifier(name) && !rest.contains(" end"))
                    .unwrap_or_else(|| panic!("layout.lua: not a function's first line: {bare:?}"));
                open = Some(name);
            }
            (None, None) => panic!("layout.lua: not in a block: {bare:?}"),
            (Some(name), Some(_)) => panic!("layout.lua: a function opened inside {name}"),
            (Some(name), None) if bare == "end" || bare.starts_with("end --") => {
                let text = &LAYOUT[start..end];
                let only = if text.contains("[string layout]") {
                    Some(RedisLayout::String)
                } else if text.contains("[hash layout]") {
                    Some(RedisLayout::Hash)
                } else {
                    None
                };
                blocks.push(Block { name, only, text });
                open = None;
                start = end;
            }
            (Some(_), None) => {}
        }
        at = end;
    }
    assert!(open.is_none(), "layout.lua: a function without its end");
    blocks
}

fn is_identifier_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty() && name.chars().all(is_identifier_char)
}

/// Whether `text` uses `name`: the whole word, however it is used (called, or passed
/// as a value). A word in a comment counts too: a function too many costs nothing
/// but its closure, one missing is an error at run time.
fn uses(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        !before.is_some_and(is_identifier_char) && !after.is_some_and(is_identifier_char)
    })
}

/// `body` preceded by the layout's functions it needs, as they write in `layout`.
pub(super) fn link(body: &str, layout: RedisLayout) -> String {
    let blocks: Vec<Block> = blocks()
        .into_iter()
        .filter(|b| b.only.is_none_or(|only| only == layout))
        .collect();
    let mut needed = vec![false; blocks.len()];
    let mut unread = vec![body];
    while let Some(text) = unread.pop() {
        for (i, block) in blocks.iter().enumerate() {
            if !needed[i] && uses(text, block.name) {
                needed[i] = true;
                unread.push(block.text);
            }
        }
    }
    let mut script: String = blocks
        .iter()
        .zip(&needed)
        .filter(|(_, needed)| **needed)
        .map(|(block, _)| block.text)
        .collect();
    script.push_str(body);
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPTS: [&str; 6] = [
        include_str!("insert_if_absent.lua"),
        include_str!("replace_if_same.lua"),
        include_str!("holder_write.lua"),
        include_str!("mirror.lua"),
        include_str!("get.lua"),
        include_str!("delete_if_same.lua"),
    ];

    fn defines(script: &str, name: &str) -> bool {
        script.contains(&format!("local function {name}("))
    }

    #[test]
    fn every_function_a_linked_script_calls_is_defined_once_before_its_use() {
        let names: Vec<&str> = blocks().iter().map(|b| b.name).collect();
        for layout in [RedisLayout::String, RedisLayout::Hash] {
            for body in SCRIPTS {
                let script = link(body, layout);
                for name in &names {
                    let definition = format!("local function {name}(");
                    let defined_at = script.find(&definition);
                    assert!(
                        script.matches(&definition).count() <= 1,
                        "{name} defined twice ({layout:?})"
                    );
                    let first_call = script
                        .match_indices(&format!("{name}("))
                        .map(|(i, _)| i)
                        .find(|&i| {
                            !script[..i].ends_with("local function ") && uses(&script[i..], name)
                        });
                    if let Some(call) = first_call {
                        let defined_at = defined_at.unwrap_or_else(|| {
                            panic!("{name} called but not defined ({layout:?}):\n{script}")
                        });
                        assert!(defined_at < call, "{name} called before its definition");
                    }
                }
            }
        }
    }

    #[test]
    fn a_script_carries_only_what_it_calls_and_its_layout_s_writer() {
        let claim = include_str!("insert_if_absent.lua");
        let string = link(claim, RedisLayout::String);
        assert!(defines(&string, "read_record") && defines(&string, "write_record"));
        assert!(string.contains("redis.call('SET', key, record)"));
        for unused in ["token_decimal", "older", "expires_of_claim", "released"] {
            assert!(!defines(&string, unused), "{unused} in the claim script");
        }
        let hash = link(claim, RedisLayout::Hash);
        assert!(hash.contains("redis.call('HSET'") && !hash.contains("redis.call('SET'"));
        assert!(defines(&hash, "token_decimal") && defines(&hash, "state_of"));
        // A read writes nothing, in either layout.
        let get = link(include_str!("get.lua"), RedisLayout::Hash);
        assert!(!defines(&get, "write_record"));
    }

    #[test]
    fn every_function_of_the_layout_is_a_block_of_its_own() {
        // Counted without the parser: a line that opens a function, by hand.
        let opened: Vec<&str> = LAYOUT
            .lines()
            .filter_map(|l| l.strip_prefix("local function "))
            .map(|rest| rest.split('(').next().unwrap_or_default().trim())
            .collect();
        let parsed: Vec<&str> = blocks().iter().map(|b| b.name).collect();
        assert_eq!(parsed, opened);
        assert!(parsed.len() >= 10, "{parsed:?}");
    }

    #[test]
    fn a_use_is_the_whole_name() {
        assert!(uses("x = older(a, b)", "older"));
        assert!(uses("table.sort(t, older)", "older"));
        assert!(uses("x = older (a)", "older"));
        assert!(!uses("x = is_older(a, b)", "older"));
        assert!(!uses("x = older_than(a)", "older"));
        assert!(uses("(older(a))", "older"));
    }
}
