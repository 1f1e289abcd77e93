//! Reads callgrind's output format (one event, `Ir`) into per-function self
//! and inclusive instruction counts.
//!
//! The format (valgrind's "Callgrind Format Specification"): `ob=`/`fl=`/
//! `fn=` set the current object, file and function (names are compressed:
//! `(id) name` the first time, `(id)` after); cost lines are `<position>
//! <cost>`; a `calls=<count> <target>` line is followed by one cost line
//! that is the *inclusive* cost of those calls to the function named by the
//! preceding `cfn=` (in `cob=`, or the caller's object). `fi=`/`fe=` switch
//! the file of inlined code and do not change the function.
//!
//! With `--dump-instr=yes` (`positions: instr line`) every cost line starts
//! with an instruction address and then a line number, each compressed on its
//! own: `+n`/`-n` relative to the previous cost line's, `*` the same, or
//! absolute (`0x…` or decimal). The self cost per address is then kept too,
//! for line-by-line attribution (`lines.rs`).

use std::collections::HashMap;

use anyhow::{bail, Context, Result};

/// A function: its object (shared library or executable) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Func {
    pub object: String,
    pub name: String,
}

/// The counts of one profile.
#[derive(Debug, Default)]
pub struct Profile {
    pub total: u64,
    /// Instructions executed in each function itself.
    pub self_cost: HashMap<Func, u64>,
    /// (caller, callee) → (calls, inclusive instructions of those calls).
    pub calls: HashMap<(Func, Func), (u64, u64)>,
    /// Object → instruction address → instructions executed at that address itself
    /// (empty unless the profile has instruction positions).
    pub by_address: HashMap<String, HashMap<u64, u64>>,
}

impl Profile {
    /// Inclusive instructions of `f`: its own plus those of the calls it
    /// made (calls to itself excluded: their cost is already its own).
    pub fn inclusive(&self, f: &Func) -> u64 {
        let own = self.self_cost.get(f).copied().unwrap_or(0);
        own + self
            .calls
            .iter()
            .filter(|((caller, callee), _)| caller == f && callee != f)
            .map(|(_, (_, cost))| cost)
            .sum::<u64>()
    }

    /// Every function whose name is `name` or ends with `::name` (Rust paths),
    /// ignoring callgrind's `'N` recursion suffix.
    pub fn named(&self, name: &str) -> Vec<Func> {
        let mut v: Vec<Func> = self
            .self_cost
            .keys()
            .chain(self.calls.keys().flat_map(|(a, b)| [a, b]))
            .filter(|f| {
                let n = f.name.split('\'').next().unwrap_or(&f.name);
                n == name || n.ends_with(&format!("::{name}"))
            })
            .cloned()
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The sum of [`inclusive`](Self::inclusive) over the functions called `name`.
    pub fn inclusive_named(&self, name: &str) -> u64 {
        self.named(name).iter().map(|f| self.inclusive(f)).sum()
    }

    /// Callees of `caller` in an object whose path contains `object`.
    pub fn callees_in(&self, caller: &Func, object: &str) -> Vec<Func> {
        let mut v: Vec<Func> = self
            .calls
            .keys()
            .filter(|(a, b)| a == caller && b.object.contains(object))
            .map(|(_, b)| b.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Inclusive instructions of the calls into `callee` from anywhere
    /// (except from itself).
    pub fn calls_into(&self, callee: &Func) -> (u64, u64) {
        self.calls
            .iter()
            .filter(|((a, b), _)| b == callee && a != callee)
            .fold((0, 0), |acc, (_, (n, c))| (acc.0 + n, acc.1 + c))
    }
}

/// Parses a callgrind output file's text.
pub fn parse(text: &str) -> Result<Profile> {
    let mut p = Profile::default();
    let mut names: HashMap<(char, u64), String> = HashMap::new();
    let mut ob = String::new();
    let mut func: Option<Func> = None;
    let mut cob: Option<String> = None;
    let mut cfn: Option<String> = None;
    // Set by a `calls=` line: the next cost line is that call's inclusive cost.
    let mut pending_calls: Option<u64> = None;
    let mut summary: Option<u64> = None;
    // `positions:` — whether cost lines start with an address, and how many position
    // fields precede the cost; the previous cost line's positions, for the compression.
    let mut by_instr = false;
    let mut npos = 1usize;
    let mut last = [0u64; 2];

    // `(id) name` defines, `(id)` refers; the kinds: o(bject), f(unction).
    let mut resolve = |kind: char, v: &str| -> Result<String> {
        let v = v.trim();
        if let Some(rest) = v.strip_prefix('(') {
            let (id, name) = rest.split_once(')').context("bad compressed name")?;
            let id: u64 = id.parse().context("bad compressed name id")?;
            let name = name.trim();
            if name.is_empty() {
                return names
                    .get(&(kind, id))
                    .cloned()
                    .with_context(|| format!("undefined name ({id})"));
            }
            names.insert((kind, id), name.to_string());
            Ok(name.to_string())
        } else {
            Ok(v.to_string())
        }
    };

    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("line {}", lineno + 1);
        if let Some(v) = line.strip_prefix("ob=") {
            ob = resolve('o', v).with_context(at)?;
        } else if let Some(v) = line.strip_prefix("fn=") {
            func = Some(Func {
                object: ob.clone(),
                name: resolve('f', v).with_context(at)?,
            });
        } else if let Some(v) = line.strip_prefix("cob=") {
            cob = Some(resolve('o', v).with_context(at)?);
        } else if let Some(v) = line.strip_prefix("cfn=") {
            cfn = Some(resolve('f', v).with_context(at)?);
        } else if let Some(v) = line.strip_prefix("calls=") {
            let n = v.split_whitespace().next().unwrap_or("0");
            pending_calls = Some(n.parse().with_context(|| format!("{}: bad calls", at()))?);
        } else if let Some(v) = line
            .strip_prefix("summary:")
            .or_else(|| line.strip_prefix("totals:"))
        {
            summary = v.split_whitespace().next().and_then(|s| s.parse().ok());
        } else if let Some(v) = line.strip_prefix("positions:") {
            let kinds: Vec<&str> = v.split_whitespace().collect();
            by_instr = kinds.first() == Some(&"instr");
            npos = kinds.len().max(1);
        } else if line.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '*')) {
            let mut fields = line.split_whitespace();
            for slot in last.iter_mut().take(npos) {
                let p = fields.next().unwrap_or("*");
                *slot = position(p, *slot).with_context(|| format!("{}: bad position", at()))?;
            }
            let cost: u64 = match fields.next() {
                Some(c) => c.parse().with_context(|| format!("{}: bad cost", at()))?,
                None => 0,
            };
            let Some(f) = &func else {
                bail!("{}: cost before any fn=", at());
            };
            if let Some(n) = pending_calls.take() {
                let callee = Func {
                    object: cob.take().unwrap_or_else(|| ob.clone()),
                    name: cfn
                        .take()
                        .with_context(|| format!("{}: calls= without cfn=", at()))?,
                };
                let e = p.calls.entry((f.clone(), callee)).or_default();
                e.0 += n;
                e.1 += cost;
            } else {
                *p.self_cost.entry(f.clone()).or_default() += cost;
                if by_instr {
                    *p.by_address
                        .entry(f.object.clone())
                        .or_default()
                        .entry(last[0])
                        .or_default() += cost;
                }
            }
        } else if line.starts_with("fl=") || line.starts_with("fi=") || line.starts_with("fe=") {
            // Files: names share the `f` id space with functions in some
            // versions; record the definition so that later references
            // resolve, and otherwise ignore.
            let v = &line[3..];
            if v.trim_start().starts_with('(') && v.contains(") ") {
                let _ = resolve('l', v);
            }
        } else if line.starts_with("cfi=") || line.starts_with("cfl=") {
            let v = &line[4..];
            if v.trim_start().starts_with('(') && v.contains(") ") {
                let _ = resolve('l', v);
            }
        }
        // Other header lines (version:, creator:, pid:, cmd:, part:, desc:,
        // positions:, events:, jump=, jcnd=) carry nothing we need.
    }
    p.total = match summary {
        Some(s) => s,
        None => p.self_cost.values().sum(),
    };
    Ok(p)
}

/// One compressed position: `*` the previous one, `+n`/`-n` relative to it, else absolute
/// (`0x…` hexadecimal or decimal).
fn position(p: &str, prev: u64) -> Result<u64> {
    let num = |t: &str| -> Result<u64> {
        Ok(match t.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16)?,
            None => t.parse()?,
        })
    };
    Ok(match p.as_bytes().first() {
        Some(b'*') => prev,
        Some(b'+') => prev.wrapping_add(num(&p[1..])?),
        Some(b'-') => prev.wrapping_sub(num(&p[1..])?),
        _ => num(p)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 1000

ob=(1) /bin/prog
fl=(1) prog.c
fn=(1) main
10 5
cob=(2) /lib/librxe.so
cfi=(2) ???
cfn=(2) 0x0000000000001230
calls=3 0
11 300
cfn=(3) instr_post
calls=2 20
+1 400
fn=(3)
20 50
cob=(2)
cfn=(2)
calls=2 0
* 340
fn=(4) opcost::instr_poll'2
21 7
ob=(2)
fl=(2)
fn=(2)
0 640
";

    #[test]
    fn self_inclusive_and_calls() {
        let p = parse(SAMPLE).unwrap();
        assert_eq!(p.total, 1000);
        let main = Func {
            object: "/bin/prog".into(),
            name: "main".into(),
        };
        let post = Func {
            object: "/bin/prog".into(),
            name: "instr_post".into(),
        };
        let rxe = Func {
            object: "/lib/librxe.so".into(),
            name: "0x0000000000001230".into(),
        };
        assert_eq!(p.self_cost[&main], 5);
        assert_eq!(p.inclusive(&main), 5 + 300 + 400);
        assert_eq!(p.inclusive(&post), 50 + 340);
        assert_eq!(p.calls[&(post.clone(), rxe.clone())], (2, 340));
        assert_eq!(p.callees_in(&post, "librxe"), vec![rxe.clone()]);
        assert_eq!(p.calls_into(&rxe), (5, 640));
        assert_eq!(
            p.named("instr_poll").len(),
            1,
            "Rust path and recursion suffix"
        );
        assert_eq!(p.inclusive_named("instr_post"), 390);
    }

    #[test]
    fn instruction_positions() {
        let text = "\
positions: instr line
events: Ir
ob=(1) /bin/prog
fl=(1) prog.c
fn=(1) main
0x1000 10 5
+4 * 6
+2 11 7
cfn=(2) callee
calls=1 0x2000 20
+3 12 100
* * 8
-9 +1 9
fn=(2)
0x2000 20 100
";
        let p = parse(text).unwrap();
        let a = &p.by_address["/bin/prog"];
        assert_eq!(a[&0x1000], 5 + 9, "-9 goes back to the first address");
        assert_eq!(a[&0x1004], 6);
        assert_eq!(a[&0x1006], 7);
        // the call's inclusive cost is not the caller's own, but its position counts
        assert_eq!(a[&0x1009], 8);
        assert_eq!(a[&0x2000], 100);
        assert_eq!(p.self_cost.values().sum::<u64>(), 5 + 6 + 7 + 8 + 9 + 100);
        assert!(parse(SAMPLE).unwrap().by_address.is_empty());
    }
}
