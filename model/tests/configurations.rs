//! Every configuration idem ships, model-checked under the faults it claims to survive
//! (every property holds), and under the faults it documents as its limits (the
//! checker must find the counterexample the book describes, `docs/guarantee.md`).
//!
//! `IDEM_MODEL_DEEP=1` checks a longer run with three attempts everywhere but under a
//! Redis failover; `IDEM_MODEL_ONLY=<part of a name>` checks only those configurations.

use idem_model::*;
use std::collections::BTreeSet;

/// The faults every shared store survives: replicas dying before the effect, replies
/// lost after writes landed, and one replica's clock further ahead than a lease.
const SURVIVED: Faults = Faults {
    crash: true,
    pause: false,
    lost_replies: true,
    holder_skew: SKEW_BEYOND,
    store_skew: 0,
    failover: false,
    edge_state_loss: false,
    redis_loss: false,
    releases: false,
    late_heartbeats: false,
    edge_lost_writes: false,
    holder_lag: 0,
};

fn deep() -> bool {
    std::env::var_os("IDEM_MODEL_DEEP").is_some_and(|v| v == "1")
}

/// A configuration and the properties it is expected to violate.
struct Case {
    config: Config,
    violated: &'static [&'static str],
}

fn case(config: Config, violated: &'static [&'static str]) -> Case {
    let config = match deep() {
        // Two more ticks everywhere; a third attempt everywhere but under a Redis
        // failover (those configurations already run to millions of states).
        true => {
            let mut attempts = config.attempts.clone();
            if attempts.len() < 3 && !config.faults.failover {
                attempts.push(0);
            }
            let ticks = config.act_ticks + 2;
            config.attempts(&attempts).ticks(ticks)
        }
        false => config,
    };
    Case { config, violated }
}

/// The configurations whose every property must hold.
fn claimed() -> Vec<Case> {
    vec![
        case(
            Config::new("memory", Deployment::Memory)
                .attempts(&[0, 0, 1])
                .faults(SURVIVED),
            &[],
        ),
        case(
            Config::new("postgres on-conflict", Deployment::PostgresOnConflict)
                .attempts(&[0, 0, 1])
                .faults(SURVIVED),
            &[],
        ),
        case(
            Config::new("postgres advisory-lock", Deployment::PostgresAdvisoryLock)
                .attempts(&[0, 0, 1])
                .faults(SURVIVED),
            &[],
        ),
        case(
            Config::new("redis, no failover", Deployment::Redis)
                .attempts(&[0, 0, 1])
                .faults(SURVIVED),
            &[],
        ),
        case(
            Config::new("tiered sync, Redis failing over", Deployment::TieredSync).faults(Faults {
                failover: true,
                store_skew: SKEW_BEYOND,
                redis_loss: true,
                holder_skew: 0,
                ..SURVIVED
            }),
            &[],
        ),
        case(
            Config::new(
                "tiered async, Redis losing its records",
                Deployment::TieredAsync,
            )
            .faults(Faults {
                redis_loss: true,
                ..SURVIVED
            }),
            &[],
        ),
        case(
            Config::new(
                "postgres on-conflict, a replica within the tolerance",
                Deployment::PostgresOnConflict,
            )
            .faults(Faults {
                holder_skew: SKEW_WITHIN,
                ..SURVIVED
            }),
            &[],
        ),
        case(
            Config::new(
                "edge over origin, edge losing state",
                Deployment::EdgeOverOrigin,
            )
            .faults(Faults {
                edge_state_loss: true,
                ..SURVIVED
            }),
            &[],
        ),
        // Another body under the key at the edge, handlers that release it, and edge
        // writes that never land (the edge loses track of its claim).
        case(
            Config::new(
                "edge over origin, releases, lost edge writes",
                Deployment::EdgeOverOrigin,
            )
            .attempts(&[0, 0, 1])
            .faults(Faults {
                releases: true,
                edge_lost_writes: true,
                holder_skew: 0,
                ..SURVIVED
            }),
            &[],
        ),
        case(
            Config::new(
                "postgres on-conflict, releases, late heartbeats",
                Deployment::PostgresOnConflict,
            )
            .attempts(&[0, 0, 1])
            .faults(Faults {
                releases: true,
                late_heartbeats: true,
                holder_skew: 0,
                ..SURVIVED
            }),
            &[],
        ),
        case(
            Config::new(
                "postgres on-conflict, transactional, pauses",
                Deployment::PostgresOnConflict,
            )
            .transactional()
            .faults(Faults {
                pause: true,
                ..SURVIVED
            }),
            &[],
        ),
        case(
            Config::new(
                "postgres advisory-lock, transactional, pauses",
                Deployment::PostgresAdvisoryLock,
            )
            .transactional()
            .faults(Faults {
                pause: true,
                ..SURVIVED
            }),
            &[],
        ),
    ]
}

/// The configurations whose documented limits the checker must find.
fn limits() -> Vec<Case> {
    use idem_model::properties::*;
    vec![
        // The handler's effect commits on its own: a holder that stalls past its lease
        // after it (or dies before completing) leaves a takeover to run it again.
        case(
            Config::new(
                "postgres on-conflict, separate, pauses",
                Deployment::PostgresOnConflict,
            )
            .faults(Faults {
                pause: true,
                ..SURVIVED
            }),
            &[AT_MOST_ONCE, ONE_ANSWER],
        ),
        // A claim acknowledged by a master that dies before replicating it is gone: the
        // promoted replica lets a retry run the handler again, under the same token.
        case(
            Config::new("redis, failover", Deployment::RedisFailover).faults(Faults {
                failover: true,
                ..SURVIVED
            }),
            &[AT_MOST_ONCE, ONE_ANSWER, TOKENS_INCREASE],
        ),
        // Tiered async: a write acknowledged by the master and lost with it before
        // replication and before the outbox wrote it behind.
        case(
            Config::new("tiered async, failover", Deployment::TieredAsync)
                .faults(Faults {
                    failover: true,
                    lost_replies: true,
                    ..Faults::default()
                })
                .ticks(4),
            // A holder whose record the failover lost, still owning the key in Postgres,
            // writes over the claim a retry made meanwhile: both ran.
            &[
                AT_MOST_ONCE,
                ONE_ANSWER,
                FENCED_NEVER_COMPLETES,
                TOKENS_INCREASE,
            ],
        ),
        // The code before the store's clock judged (issue 11): a replica whose clock
        // runs a lease ahead takes over a live holder.
        case(
            Config::new(
                "postgres on-conflict, replica's clock (before the fix)",
                Deployment::PostgresOnConflict,
            )
            .faults(SURVIVED)
            .with_bug(Bug::ReplicaClock),
            &[AT_MOST_ONCE, ONE_ANSWER, NO_KEY_STUCK],
        ),
        // A takeover that swaps on the token alone overwrites the completion a paused
        // holder committed (with its effect) since the takeover read the record.
        case(
            Config::new(
                "postgres on-conflict, transactional, token-only swap (bug)",
                Deployment::PostgresOnConflict,
            )
            .transactional()
            .faults(Faults {
                pause: true,
                ..SURVIVED
            })
            .with_bug(Bug::TokenOnlySwap),
            &[AT_MOST_ONCE, ONE_ANSWER],
        ),
        // Found by this model: tiered async before a holder fenced by a provisional
        // claim asked the authority. Redis loses its records (all written behind); a
        // retry's cold path puts its provisional claim in Redis; the live holder's
        // heartbeat is refused as fenced and stops; the lease runs out in Postgres; the
        // retry takes over and runs the handler again.
        case(
            Config::new(
                "tiered async, Redis losing its records, before the fix",
                Deployment::TieredAsync,
            )
            .faults(Faults {
                redis_loss: true,
                ..SURVIVED
            })
            .with_bug(Bug::FencedByProvisionalClaim),
            &[AT_MOST_ONCE, ONE_ANSWER],
        ),
        // Issue 35: a holder's completion refused as missing in Redis, allowed by
        // Postgres, and copied into Redis in a step of its own: a retry's claim lands in
        // Redis first, the copy is refused, and the holder counted it written all the
        // same. Redis then holds a claim nobody renews, and a later retry takes it over.
        case(
            Config::new(
                "tiered async, Redis losing its records, a refused copy counted (before the fix)",
                Deployment::TieredAsync,
            )
            .faults(Faults {
                redis_loss: true,
                ..SURVIVED
            })
            .with_bug(Bug::RefusedCopyCounted),
            &[AT_MOST_ONCE, ONE_ANSWER],
        ),
        // The cold read sent with the claim (a speed-up, not kept): it read Postgres before
        // the holder's claim was written behind; Redis then lost its records, and the
        // retry's claim, finding Redis empty, trusted the older read and ran again.
        case(
            Config::new(
                "tiered async, Redis losing its records, cold read sent with the claim (not kept)",
                Deployment::TieredAsync,
            )
            // Redis' loss alone shows it; the other faults only grow the state space.
            .faults(Faults {
                redis_loss: true,
                ..Faults::default()
            })
            .with_bug(Bug::ColdReadWithTheClaim),
            &[
                AT_MOST_ONCE,
                ONE_ANSWER,
                FENCED_NEVER_COMPLETES,
                TOKENS_INCREASE,
            ],
        ),
        // d306f92: a heartbeat sent before its holder released the key lands after the
        // release and renews the released claim: the corrected request, another body,
        // is refused with 422 for a key nothing ran under.
        case(
            Config::new(
                "postgres on-conflict, releases, late heartbeats over an expired claim (before the fix)",
                Deployment::PostgresOnConflict,
            )
            .attempts(&[0, 0, 1])
            .faults(Faults {
                releases: true,
                late_heartbeats: true,
                ..Faults::default()
            })
            .with_bug(Bug::HolderWriteOverExpired),
            &[NO_UNBOUND_REFUSAL],
        ),
        // ba39cc2: the edge's release is lost; past its lease, the edge's claim refuses
        // the corrected request (another body) that the origin, which released the key,
        // would run.
        case(
            Config::new(
                "edge over origin, releases, lost edge writes, the edge deciding alone (before the fix)",
                Deployment::EdgeOverOrigin,
            )
            .attempts(&[0, 0, 1])
            .faults(Faults {
                releases: true,
                edge_lost_writes: true,
                ..Faults::default()
            })
            .with_bug(Bug::EdgeBindsLostClaim),
            &[NO_UNBOUND_REFUSAL],
        ),
        // A holder paused past its lease, its clock estimate 80 ms behind the store's
        // since its claim, completes after a takeover ran the handler again and
        // completed in Redis (the pause limit: two effects, two answers).
        case(
            Config::new(
                "tiered async, pauses, a holder's estimate 80 ms behind",
                Deployment::TieredAsync,
            )
            .faults(Faults {
                pause: true,
                holder_lag: 80,
                ..Faults::default()
            }),
            &[AT_MOST_ONCE, ONE_ANSWER],
        ),
        // e57a685: the same before the fix. Refused in Redis by the takeover's answer,
        // the late holder finds its claim in Postgres (the takeover not yet written
        // behind) live at its lagging estimate, and writes its completion over the
        // answer the takeover's client was given.
        case(
            Config::new(
                "tiered async, pauses, a holder's estimate 80 ms behind, going over any record in Redis (before the fix)",
                Deployment::TieredAsync,
            )
            .faults(Faults {
                pause: true,
                holder_lag: 80,
                ..Faults::default()
            })
            .with_bug(Bug::ReplaceAnyFront),
            &[AT_MOST_ONCE, ONE_ANSWER, FENCED_NEVER_COMPLETES],
        ),
        // Holder writes without their precondition: the fenced holder completes.
        case(
            Config::new(
                "postgres on-conflict, separate, unguarded holder writes (bug)",
                Deployment::PostgresOnConflict,
            )
            .faults(Faults {
                pause: true,
                ..SURVIVED
            })
            .with_bug(Bug::UnguardedHolderWrite),
            &[AT_MOST_ONCE, ONE_ANSWER, FENCED_NEVER_COMPLETES],
        ),
    ]
}

/// What was injected, in words.
fn faults(c: &Config) -> String {
    let f = &c.faults;
    let mut out = Vec::new();
    if f.crash {
        out.push("crashes".to_owned());
    }
    if f.pause {
        out.push("pauses past the lease".to_owned());
    }
    if f.lost_replies {
        out.push("lost replies".to_owned());
    }
    if f.holder_skew != 0 {
        out.push(format!("a replica {} ms ahead", f.holder_skew));
    }
    if f.failover {
        match f.store_skew {
            0 => out.push("a Redis failover".to_owned()),
            skew => out.push(format!("a Redis failover to a replica {skew} ms ahead")),
        }
    }
    if f.redis_loss {
        out.push("Redis losing its records".to_owned());
    }
    if f.edge_state_loss {
        out.push("the edge losing its record".to_owned());
    }
    if f.releases {
        out.push("handlers releasing the key".to_owned());
    }
    if f.late_heartbeats {
        out.push("heartbeats landing late".to_owned());
    }
    if f.edge_lost_writes {
        out.push("edge writes lost".to_owned());
    }
    if f.holder_lag != 0 {
        out.push(format!("a holder's estimate {} ms behind", f.holder_lag));
    }
    let others = c.attempts.iter().filter(|&&r| r != 0).count();
    let mut attempts = format!("{} attempts", c.attempts.len());
    if others > 0 {
        attempts.push_str(", one with another body");
    }
    out.push(attempts);
    out.join(", ")
}

/// Checks every case; returns the the book's table of them.
fn run(cases: Vec<Case>) -> String {
    let mut failures = Vec::new();
    let mut table = String::from(
        "| configuration | faults injected | states | at most once | same answer | no mismatch replayed | fenced never completes | tokens increase | no stuck key | a released key refuses none |\n|---|---|--:|:-:|:-:|:-:|:-:|:-:|:-:|:-:|\n",
    );
    for Case { config, violated } in cases {
        let outcome = check(&config);
        eprintln!("{}", outcome.summary());
        assert!(
            outcome.complete,
            "{}: not every state was explored",
            config.name
        );
        let expected: BTreeSet<&str> = violated.iter().copied().collect();
        let found: BTreeSet<&str> = PROPERTIES
            .iter()
            .copied()
            .filter(|p| outcome.found(p))
            .collect();
        for p in found.difference(&expected) {
            let failure = format!(
                "{}: \"{p}\" has a counterexample:\n{}",
                config.name, outcome.found[p]
            );
            // Said at once: a long (deep) run shows it before the end.
            eprintln!("UNEXPECTED {failure}");
            failures.push(failure);
        }
        for p in expected.difference(&found) {
            let failure = format!(
                "{}: \"{p}\" was expected to fail (the book says so) and holds",
                config.name
            );
            eprintln!("UNEXPECTED {failure}");
            failures.push(failure);
        }
        if !outcome.found(properties::A_RETRY_REPLAYS) {
            failures.push(format!(
                "{}: no retry is ever replayed: the model is vacuous",
                config.name
            ));
        }
        for p in &expected {
            if let Some(trace) = outcome.found.get(p) {
                eprintln!("  counterexample to \"{p}\":\n{trace}");
            }
        }
        let another_request = config.attempts.iter().any(|&r| r != 0);
        let marks: Vec<&str> = PROPERTIES
            .iter()
            .map(|p| match (outcome.found(p), *p) {
                (true, _) => "✗",
                // Vacuous without another request under the key.
                (false, properties::MISMATCH_NEVER_REPLAYS | properties::NO_UNBOUND_REFUSAL)
                    if !another_request =>
                {
                    "—"
                }
                (false, _) => "✓",
            })
            .collect();
        table.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            config.name,
            faults(&config),
            outcome.states,
            marks.join(" | ")
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    table
}

/// Fails unless `docs/guarantee.md` holds `expected` between the model's markers.
fn chapter_holds(expected: &str) {
    let chapter =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/guarantee.md"))
            .unwrap();
    let (open, close) = ("<!-- model:start -->\n", "<!-- model:end -->");
    let start = chapter
        .find(open)
        .expect("docs/guarantee.md has the model's table")
        + open.len();
    let end = chapter
        .find(close)
        .expect("docs/guarantee.md closes the model's table");
    assert!(
        chapter[start..end] == *expected,
        "docs/guarantee.md's model table is out of date; replace it with:\n\n{expected}"
    );
}

/// Every configuration, checked: the claimed ones hold every property, the documented
/// limits have exactly the counterexamples the book states, and its table says so.
#[test]
fn every_configuration_is_model_checked() {
    let mut cases = claimed();
    cases.extend(limits());
    // `IDEM_MODEL_ONLY=<part of a name>` checks those configurations alone.
    let only = std::env::var("IDEM_MODEL_ONLY").ok();
    if let Some(only) = &only {
        cases.retain(|c| c.config.name.contains(only.as_str()));
        assert!(
            !cases.is_empty(),
            "IDEM_MODEL_ONLY={only:?} names no configuration"
        );
    }
    let table = run(cases);
    if !deep() && only.is_none() {
        chapter_holds(&table);
    }
}
