//! The core's layers, held against its imports: DESIGN.md's "Layers inside
//! the core" lists the folders (and top-level modules) of `ibverbs/src` by
//! band, and none may import one of a higher band (tests aside). Nor may
//! any import through the crate root (`crate::QueuePair`): inside the
//! crate, a module names the module it imports from. A new upward or
//! root-routed import fails here, naming the file and the name.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The bands of DESIGN.md's core diagram: `N  module module …` lines of the
/// code block that follows the "Layers inside the core" heading.
fn bands() -> BTreeMap<String, u32> {
    let design = fs::read_to_string(Path::new(ROOT).join("../DESIGN.md")).unwrap();
    let section = design
        .split("### Layers inside the core")
        .nth(1)
        .expect("DESIGN.md has a \"Layers inside the core\" section");
    let block = section.split("```").nth(1).expect("its diagram");
    let mut bands = BTreeMap::new();
    for line in block.lines() {
        let mut words = line.split_whitespace();
        let Some(band) = words.next().and_then(|w| w.parse::<u32>().ok()) else {
            continue;
        };
        for module in words.take_while(|w| *w != "—" && !w.starts_with('(')) {
            assert!(
                bands.insert(module.to_string(), band).is_none(),
                "{module} twice in DESIGN.md's diagram"
            );
        }
    }
    bands
}

/// The crate root's re-exports: name → the module it comes from.
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for stmt in statements(lib, "pub use ") {
        let (path, items) = match stmt.split_once("::{") {
            Some((path, items)) => (path, items.trim_end_matches('}')),
            None => match stmt.rsplit_once("::") {
                Some((path, item)) => (path, item),
                None => continue,
            },
        };
        let module = path.split("::").next().unwrap().to_string();
        for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            names.insert(item.to_string(), module.clone());
        }
    }
    names
}

/// The statements of `src` starting with `prefix`, whitespace squeezed,
/// without the prefix and the `;`.
fn statements(src: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find(prefix) {
        let at_line_start = i == 0 || rest[..i].ends_with('\n');
        let tail = &rest[i + prefix.len()..];
        let end = tail.find(';').unwrap_or(tail.len());
        if at_line_start {
            out.push(tail[..end].split_whitespace().collect::<Vec<_>>().join(""));
        }
        rest = &tail[end..];
    }
    out
}

/// `src` without comment lines and `#[cfg(test)]` items.
fn code(src: &str) -> String {
    let mut s: String = src
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    while let Some(i) = s.find("#[cfg(test)]") {
        let brace = s[i..].find('{').map(|b| i + b);
        let semi = s[i..].find(';').map(|b| i + b);
        let end = match (brace, semi) {
            (Some(b), Some(e)) if e < b => e,
            (None, Some(e)) => e,
            (Some(b), _) => {
                let mut depth = 0;
                let mut end = b;
                for (k, c) in s[b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, None) => s.len() - 1,
        };
        s.replace_range(i..=end, "");
    }
    s
}

/// Every name `code` takes from `crate::`: the first segment of each path.
fn crate_names(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let tail = &code[i + "crate::".len()..];
        if let Some(group) = tail.strip_prefix('{') {
            let inner = &group[..group.find(';').unwrap_or(group.len())];
            let mut depth = 0;
            let mut item = String::new();
            for c in inner.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(first_segment(&item));
                        item.clear();
                    }
                    c => item.push(c),
                }
            }
            names.insert(first_segment(&item));
        } else {
            names.insert(first_segment(tail));
        }
    }
    names.remove("");
    names
}

fn first_segment(path: &str) -> String {
    path.trim()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_one_of_a_higher_band() {
    let src = Path::new(ROOT).join("src");
    let bands = bands();
    let roots = root_names(&fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut modules = BTreeSet::new();
    let mut upward = Vec::new();
    let mut rooted = Vec::new();
    for file in &files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .to_string();
        let name = file.file_name().unwrap().to_string_lossy();
        if rel == "lib.rs" || name == "tests.rs" || rel.contains("/tests/") {
            continue;
        }
        let module = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        modules.insert(module.clone());
        let Some(&own) = bands.get(&module) else {
            continue; // reported below
        };
        for name in crate_names(&code(&fs::read_to_string(file).unwrap())) {
            let target = if bands.contains_key(&name) {
                name.clone()
            } else if let Some(m) = roots.get(&name) {
                rooted.push(format!("{rel} takes `{name}` through the crate root ({m})"));
                m.clone()
            } else {
                continue; // a macro, or a name of this module
            };
            let band = bands[&target];
            if band > own {
                upward.push(format!(
                    "{rel} (band {own}) takes `{name}` from {target} (band {band})"
                ));
            }
        }
    }
    let missing: Vec<_> = modules.iter().filter(|m| !bands.contains_key(*m)).collect();
    assert!(
        missing.is_empty(),
        "modules missing from DESIGN.md's diagram: {missing:?}"
    );
    let stale: Vec<_> = bands.keys().filter(|m| !modules.contains(*m)).collect();
    assert!(
        stale.is_empty(),
        "DESIGN.md's diagram names modules that do not exist: {stale:?}"
    );
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
    assert!(
        rooted.is_empty(),
        "imports through the crate root (name the module instead):\n{}",
        rooted.join("\n")
    );
}

/// The crate root stays a short list (at most 40 names: its re-exports,
/// namespaces and re-exported crates), and `prelude` holds exactly the
/// root's re-exports but `Error` and `Result`.
#[test]
fn the_crate_root_stays_small_and_the_prelude_follows_it() {
    let src = Path::new(ROOT).join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap();
    let names = root_names(&code(&lib));
    let modules = statements(&lib, "pub mod ").len()
        + statements(&lib, "pub use ")
            .iter()
            .filter(|s| !s.contains("::"))
            .count();
    assert!(
        names.len() + modules <= 40,
        "the crate root exports {} names and {modules} modules and crates: at most 40 in all",
        names.len()
    );
    let prelude = fs::read_to_string(src.join("prelude.rs")).unwrap();
    let prelude: BTreeSet<String> = root_names(&code(&prelude)).into_keys().collect();
    let expected: BTreeSet<String> = names
        .into_keys()
        .filter(|n| n != "Error" && n != "Result")
        .collect();
    assert_eq!(
        prelude, expected,
        "prelude.rs and the crate root's re-exports differ"
    );
}
