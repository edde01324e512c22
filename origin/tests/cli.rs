//! The binary's command line: bad configuration gets a readable message and a
//! non-zero exit, before anything is served.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem-origin"));
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("IDEM_STORE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn postgres_without_a_url_is_refused() {
    let o = run(&["--store", "postgres"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--store postgres needs --database-url"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unknown_store_and_bad_durations_are_refused_by_name() {
    let o = run(&["--store", "cassandra"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cassandra"), "{}", stderr(&o));
    let o = run(&["--lease", "soon"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not a duration"), "{}", stderr(&o));
    let o = run(&[], &[("IDEM_TTL", "1s"), ("IDEM_LEASE", "30s")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--ttl"), "{}", stderr(&o));
}

#[test]
fn an_unreachable_database_fails_fast_with_the_reason() {
    let started = Instant::now();
    let o = run(
        &[
            "--store",
            "postgres",
            "--database-url",
            "postgres://idem:secret@127.0.0.1:1/idem",
            "--store-timeout",
            "2s",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("cannot use the Postgres store"), "{err}");
    assert!(!err.contains("secret"), "the password is redacted: {err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_busy_port_is_reported() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let o = run(&["--listen", &addr], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot listen on"), "{}", stderr(&o));
}

#[test]
fn transactional_completion_without_postgres_records_is_refused_at_start_up() {
    for store in ["memory", "redis"] {
        let mut args = vec!["--store", store, "--demo-completion", "transactional"];
        if store == "redis" {
            args.extend(["--redis-url", "redis://127.0.0.1:1"]);
        }
        let o = run(&args, &[]);
        assert_eq!(o.status.code(), Some(2), "{store}");
        assert!(
            stderr(&o).contains(
                "--demo-completion transactional needs the records and the charges in one Postgres"
            ),
            "{store}: {}",
            stderr(&o)
        );
    }
}

/// The library refuses too, at start-up, naming the store.
#[test]
fn the_layer_refuses_transactions_on_a_store_without_them() {
    use idem::IdempotencyLayer;
    use idem::MemoryStore;
    let err = IdempotencyLayer::new(std::sync::Arc::new(MemoryStore::new()))
        .transactional()
        .err()
        .expect("refused");
    assert_eq!(err.store, "memory");
    assert!(err.to_string().contains("outside Postgres"), "{err}");
}

/// The naive strategy is unsafe on purpose: a build without the `testing` feature
/// (every release build) refuses it before connecting to anything.
#[cfg(not(feature = "testing"))]
#[test]
fn the_naive_strategy_is_only_in_test_builds() {
    let o = run(
        &[
            "--store",
            "postgres",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/idem",
            "--pg-strategy",
            "naive",
        ],
        &[],
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("only built for tests"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn an_upstream_that_is_not_an_http_or_https_url_is_refused() {
    for (url, says) in [
        ("ftp://payments:21", "must be an http:// or https:// URL"),
        ("not a url", "is not a URL"),
        ("http://127.0.0.1:9000/?a=1", "must not have a query"),
    ] {
        let o = run(&["--upstream", url], &[]);
        assert_eq!(o.status.code(), Some(2), "{url}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{url}: {}", stderr(&o));
    }
}

/// A route file holding `text`, in a directory of this test process's own.
fn route_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("routes.toml");
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn a_bad_route_file_is_refused_with_its_line() {
    let file = route_file(
        "routes",
        "[[route]]\npath = \"/v1/charges\"\nwait = \"soon\"\n",
    );
    let o = run(&["--routes", file.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(2));
    let expected = format!("{}:3:8: wait: \"soon\" is not a duration", file.display());
    assert!(stderr(&o).contains(&expected), "{}", stderr(&o));
    let o = run(&["--routes", "/nonexistent/routes.toml"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--routes /nonexistent/routes.toml: cannot read it"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[test]
fn a_path_pattern_that_could_never_match_is_refused() {
    for (pattern, says) in [
        ("v1/charges", "must start with /"),
        ("/v1/charges/", "is matched as \"/v1/charges\""),
    ] {
        let o = run(&["--require-key-on", pattern], &[]);
        assert_eq!(o.status.code(), Some(2), "{pattern}");
        assert!(
            stderr(&o).contains("--require-key-on: ") && stderr(&o).contains(says),
            "{pattern}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn the_admin_listener_needs_a_readable_token_file_of_long_tokens() {
    let dir = std::env::temp_dir().join(format!("idem-cli-admin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let short = dir.join("short.tokens");
    std::fs::write(&short, "bob:tooshort\n").unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["--admin-listen", "127.0.0.1:0"],
            "--admin-listen needs --admin-token-file",
        ),
        (
            &["--admin-token-file", "/nonexistent"],
            "--admin-token-file is for --admin-listen",
        ),
        (
            &["--metrics-on-admin"],
            "--metrics-on-admin needs --admin-listen",
        ),
        (
            &[
                "--admin-listen",
                "127.0.0.1:0",
                "--admin-token-file",
                "/nonexistent/tokens",
            ],
            "cannot read the admin token file /nonexistent/tokens",
        ),
        (
            &[
                "--admin-listen",
                "127.0.0.1:0",
                "--admin-token-file",
                short.to_str().unwrap(),
            ],
            "line 1: a token is at least 16",
        ),
    ];
    for (args, expected) in cases {
        let o = run(args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(expected), "{args:?}: {}", stderr(&o));
        assert!(
            !stderr(&o).contains("tooshort"),
            "a token never reaches the log"
        );
    }
    // The CLI: a readable message, exit 2, when the API or the token is missing.
    let o = run(&["admin", "list"], &[("IDEM_ADMIN_TOKEN_FILE", "")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = run(
        &[
            "admin",
            "--url",
            "http://127.0.0.1:1",
            "--token-file",
            short.to_str().unwrap(),
            "list",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("cannot reach the admin API"),
        "{}",
        stderr(&o)
    );
    let o = run(&["admin", "frobnicate"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("idem-origin admin"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn convert_keys_says_what_it_needs() {
    let o = run(&["convert-keys"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--database-url"), "{}", stderr(&o));
    let o = run(&["convert-keys", "--database-url", "not a url"], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("invalid database URL"),
        "{}",
        stderr(&o)
    );
    let o = run(
        &[
            "convert-keys",
            "--database-url",
            "postgres://127.0.0.1:1/x",
            "--timeout",
            "1s",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("idem-origin convert-keys: "),
        "{}",
        stderr(&o)
    );
}

#[test]
fn proxy_mode_without_a_named_store_and_limits_that_turn_themselves_off_are_refused() {
    // Proxy mode's records in this process only, unless asked for by name.
    let o = run(&["--upstream", "http://127.0.0.1:9"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("proxy mode needs its store named"),
        "{}",
        stderr(&o)
    );
    // A scope any client can forge (a header proxies set), in proxy mode.
    let o = run(
        &[
            "--upstream",
            "http://127.0.0.1:9",
            "--store",
            "memory",
            "--scope-from",
            "header:x-forwarded-for",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("header:x-forwarded-for is one proxies set"),
        "{}",
        stderr(&o)
    );
    // (--store postgres without a URL: were the limit let through, the process would
    // still exit, on another message, rather than serve.)
    let o = run(&["--header-read-timeout", "0", "--store", "postgres"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--header-read-timeout must be more than 0"),
        "{}",
        stderr(&o)
    );
    let o = run(
        &["--store", "postgres"],
        &[("IDEM_BODY_READ_TIMEOUT", "0s")],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--body-read-timeout must be more than 0"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn an_edge_secret_that_could_be_guessed_is_refused_at_start_up() {
    let dir = std::env::temp_dir().join(format!("idem-cli-edge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("edge-secret");
    for (content, says) in [
        ("hunter2\n", "line 1: the edge secret is 7 bytes"),
        ("\n\n", "holds no secret"),
        (
            "0123456789abcdef0123\nwith a space in it, long enough\n",
            "line 2: the edge secret must be visible ASCII",
        ),
    ] {
        std::fs::write(&file, content).unwrap();
        let o = run(&["--edge-secret-file", file.to_str().unwrap()], &[]);
        assert_eq!(o.status.code(), Some(2), "{content:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{content:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("hunter2"), "the secret was echoed");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Starts the server with `args`, reads its log until a line holds `until` (or 20 s
/// pass), stops it, and returns the log read.
fn log_until(args: &[&str], until: &str) -> String {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem-origin"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("IDEM_STORE")
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut log = String::new();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        log.push_str(&line);
        log.push('\n');
        if line.contains(until) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    log
}

/// A release list holding statuses an API often answers after it acted is warned about
/// at start-up, by the flag and by a route's own `release_on` (naming its line); a
/// list without them is not. The warning is the operator's only sign that a retry of
/// such an answer runs again.
#[test]
fn release_statuses_an_api_answers_after_acting_are_warned_at_start_up() {
    const WARNING: &str = "often answers after it acted";
    let listen = ["--store", "memory", "--listen", "127.0.0.1:0"];
    let with = |extra: &[&str]| -> Vec<String> {
        listen
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect()
    };
    let args = with(&["--release-on", "default,409"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let warned = log_until(&args, WARNING);
    assert!(
        warned.contains("WARN") && warned.contains(WARNING) && warned.contains("409"),
        "{warned}"
    );
    let args = with(&["--release-on", "400,422,429"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let quiet = log_until(&args, "idem-origin listening");
    assert!(quiet.contains("idem-origin listening"), "{quiet}");
    assert!(quiet.contains("400,422,429"), "the list is logged: {quiet}");
    assert!(!quiet.contains(WARNING), "{quiet}");

    let file = route_file(
        "release",
        "[[route]]\npath = \"/v1/charges\"\nrelease_on = [400, 404]\n",
    );
    let args = with(&["--routes", file.to_str().unwrap()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let route = log_until(&args, WARNING);
    assert!(
        route.contains(WARNING) && route.contains("/v1/charges") && route.contains("404"),
        "{route}"
    );
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}
