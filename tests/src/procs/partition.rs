//! A network partition between the test's processes and one server: every TCP packet
//! to or from its port on this machine is dropped (iptables), so connections hang as
//! across a real partition — no reset, no refusal — until it heals. Healed on drop.

use std::process::Command;

/// A partition of `port`, in force until dropped.
pub struct Partition {
    port: u16,
}

/// The two rules: packets to the port and packets from it (loopback crosses INPUT both ways).
fn rules(port: u16) -> [Vec<String>; 2] {
    let p = port.to_string();
    [
        ["INPUT", "-p", "tcp", "--dport", &p, "-j", "DROP"]
            .map(String::from)
            .to_vec(),
        ["INPUT", "-p", "tcp", "--sport", &p, "-j", "DROP"]
            .map(String::from)
            .to_vec(),
    ]
}

fn iptables(action: &str, rule: &[String]) -> Result<(), String> {
    // Root's tools may be outside a test's PATH.
    let bin = ["/usr/sbin/iptables", "/sbin/iptables"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("iptables");
    let out = Command::new(bin)
        .arg("-w")
        .arg(action)
        .args(rule)
        .output()
        .map_err(|e| format!("iptables cannot run ({e}): scripts/test installs it"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables {action} {}: {}",
            rule.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Partition {
    /// Cuts `port` off. Panics, saying why, where iptables can't (not root, no netfilter).
    pub fn start(port: u16) -> Partition {
        for rule in rules(port) {
            if let Err(e) = iptables("-I", &rule) {
                // Whatever was inserted comes out again.
                drop(Partition { port });
                panic!("a network partition needs iptables: {e}");
            }
        }
        Partition { port }
    }

    /// Heals it (as dropping it does).
    pub fn heal(self) {}
}

impl Drop for Partition {
    fn drop(&mut self) {
        for rule in rules(self.port) {
            // Deleted until none is left (a rule inserted twice would otherwise stay).
            while iptables("-D", &rule).is_ok() {}
        }
    }
}
