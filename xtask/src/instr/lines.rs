//! Line-by-line attribution of a program's own instructions.
//!
//! Each instruction address's marginal self cost between a short and a long callgrind run
//! (`--dump-instr=yes`), per operation, resolved with binutils' `addr2line -i` to the innermost
//! frame in this repository's sources: std and crate code inlined into ours counts for the line
//! of ours that it was inlined into, so every instruction of the program lands on a line a
//! reader can open. Needs the binary that was measured, built with line tables.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use super::callgrind::Profile;

/// Instructions per operation attributed to one source line.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// `path:line` relative to the repository, or `(name)` of a function outside it.
    pub location: String,
    /// The line's text, trimmed (empty outside the repository).
    pub source: String,
    pub per_op: f64,
}

/// Attributes the self cost of `binary` (matched by file name among the profiles' objects)
/// between the short run `pa` and the long run `pb`, `ops` operations apart; largest first,
/// lines under half an instruction left out.
pub fn attribute(
    binary: &Path,
    pa: &Profile,
    pb: &Profile,
    ops: f64,
    repo: &Path,
) -> Result<Vec<Line>> {
    let name = binary.file_name().context("binary without a file name")?;
    let costs = |p: &Profile| -> HashMap<u64, u64> {
        p.by_address
            .iter()
            .filter(|(ob, _)| Path::new(ob.as_str()).file_name() == Some(name))
            .flat_map(|(_, m)| m.iter().map(|(a, c)| (*a, *c)))
            .collect()
    };
    let (ca, cb) = (costs(pa), costs(pb));
    if cb.is_empty() {
        bail!(
            "no instruction positions of {} in the profile",
            binary.display()
        );
    }
    let mut diff: Vec<(u64, f64)> = cb
        .iter()
        .map(|(a, c)| (*a, *c as f64 - ca.get(a).copied().unwrap_or(0) as f64))
        .chain(
            ca.iter()
                .filter(|(a, _)| !cb.contains_key(a))
                .map(|(a, c)| (*a, -(*c as f64))),
        )
        .filter(|(_, d)| *d != 0.0)
        .collect();
    diff.sort_by_key(|d| d.0);
    let frames = addr2line(binary, diff.iter().map(|d| d.0))?;
    let root = format!("{}/", repo.display());
    let mut by_line: HashMap<String, f64> = HashMap::new();
    for (addr, d) in &diff {
        let fr = frames.get(addr).map(Vec::as_slice).unwrap_or_default();
        let location = pick(fr, &root);
        *by_line.entry(location).or_default() += d / ops;
    }
    let mut files: HashMap<String, Vec<String>> = HashMap::new();
    let mut out: Vec<Line> = by_line
        .into_iter()
        .filter(|(_, v)| v.abs() >= 0.5)
        .map(|(location, per_op)| {
            let source = source_line(&mut files, repo, &location);
            Line {
                location,
                source,
                per_op,
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.per_op
            .total_cmp(&a.per_op)
            .then(a.location.cmp(&b.location))
    });
    Ok(out)
}

/// The innermost frame in the repository (generated code under `target/` excluded), as
/// `path:line`; else the outermost frame's function, in parentheses.
fn pick(frames: &[(String, String)], root: &str) -> String {
    for (_, file_line) in frames {
        if let Some(rel) = file_line.strip_prefix(root) {
            if !rel.starts_with("target/") && !rel.contains(":?") {
                return rel.split(' ').next().unwrap_or(rel).to_string();
            }
        }
    }
    match frames.last() {
        Some((f, _)) => format!("({f})"),
        None => "(unknown)".to_string(),
    }
}

fn source_line(files: &mut HashMap<String, Vec<String>>, repo: &Path, location: &str) -> String {
    let Some((file, line)) = location.rsplit_once(':') else {
        return String::new();
    };
    let Ok(line) = line.parse::<usize>() else {
        return String::new();
    };
    let lines = files.entry(file.to_string()).or_insert_with(|| {
        std::fs::read_to_string(repo.join(file))
            .map(|t| t.lines().map(|l| l.trim().to_string()).collect())
            .unwrap_or_default()
    });
    line.checked_sub(1)
        .and_then(|i| lines.get(i))
        .cloned()
        .unwrap_or_default()
}

/// `addr2line -a -i -f -C`: each address's frames, innermost first, as (function, `file:line`).
fn addr2line(
    binary: &Path,
    addrs: impl Iterator<Item = u64>,
) -> Result<HashMap<u64, Vec<(String, String)>>> {
    let input: String = addrs.map(|a| format!("{a:#x}\n")).collect();
    let mut child = Command::new("addr2line")
        .arg("-e")
        .arg(binary)
        .args(["-a", "-i", "-f", "-C"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run addr2line (install binutils)")?;
    let mut stdin = child.stdin.take().context("addr2line stdin")?;
    // addr2line answers line by line; a writer thread keeps a large input from deadlocking
    // against its output.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("addr2line writer panicked"))??;
    if !out.status.success() {
        bail!("addr2line failed on {}", binary.display());
    }
    Ok(parse_addr2line(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_addr2line(text: &str) -> HashMap<u64, Vec<(String, String)>> {
    let mut map: HashMap<u64, Vec<(String, String)>> = HashMap::new();
    let mut cur = None;
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if let Some(h) = l.strip_prefix("0x") {
            cur = u64::from_str_radix(h.trim(), 16).ok();
            if let Some(a) = cur {
                map.entry(a).or_default();
            }
            continue;
        }
        let file_line = lines.next().unwrap_or("??:0").to_string();
        if let Some(a) = cur {
            map.entry(a).or_default().push((l.to_string(), file_line));
        }
    }
    map
}

/// Lines as a tab-separated file (`per_op`, `location`, `source`), the form kept beside the
/// raw profiles so that a later `--reanalyze` does not need the binary.
pub fn to_tsv(lines: &[Line]) -> String {
    lines
        .iter()
        .map(|l| {
            format!(
                "{:.3}\t{}\t{}\n",
                l.per_op,
                l.location,
                l.source.replace(['\t', '\n'], " ")
            )
        })
        .collect()
}

pub fn from_tsv(text: &str) -> Vec<Line> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '\t');
            Some(Line {
                per_op: f.next()?.parse().ok()?,
                location: f.next()?.to_string(),
                source: f.next().unwrap_or("").to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inlined_std_counts_for_our_line() {
        let text = "0x0000000000001000\n\
                    take<T>\n/rustc/abc/library/core/src/option.rs:1886\n\
                    post\n/repo/ibverbs/src/qp/queue_pair/post.rs:523 (discriminator 2)\n\
                    main\n/repo/tools/examples/opcost.rs:10\n\
                    0x0000000000001004\n\
                    memcpy\n??:0\n";
        let m = parse_addr2line(text);
        assert_eq!(m[&0x1000].len(), 3);
        assert_eq!(
            pick(&m[&0x1000], "/repo/"),
            "ibverbs/src/qp/queue_pair/post.rs:523"
        );
        assert_eq!(pick(&m[&0x1004], "/repo/"), "(memcpy)");
        let generated = [(
            "f".to_string(),
            "/repo/target/release/build/x/out/bindings.rs:5".to_string(),
        )];
        assert_eq!(pick(&generated, "/repo/"), "(f)");
    }

    #[test]
    fn tsv_round_trip() {
        let v = vec![Line {
            location: "a.rs:3".into(),
            source: "let x\t= 1;".into(),
            per_op: 2.5,
        }];
        let back = from_tsv(&to_tsv(&v));
        assert_eq!(back[0].location, "a.rs:3");
        assert_eq!(back[0].source, "let x = 1;");
        assert_eq!(back[0].per_op, 2.5);
    }
}
