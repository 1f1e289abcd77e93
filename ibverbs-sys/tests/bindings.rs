//! The committed bindings against what bindgen makes of the installed
//! headers (feature `bindgen`, which generates `OUT_DIR/generated.rs`):
//! - headers of rdma-core 44, the release the bindings come from: equal,
//!   text for text (else run `ibverbs-sys/regenerate-bindings.sh`);
//! - a newer release: the committed bindings are a compatible subset (every
//!   constant has the same value, every function the same signature, every
//!   struct and union starts with the same fields, as rdma-core only
//!   appends), and the items of `src/newer.rs` match the newer headers'.
#![cfg(feature = "bindgen")]

use std::collections::BTreeMap;

const OLDEST: &str = "44";

fn committed() -> String {
    let path = format!(
        "{}/src/bindings/{}",
        env!("CARGO_MANIFEST_DIR"),
        env!("RDMA_VERBS_SYS_BINDINGS")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn generated() -> &'static str {
    include_str!(concat!(env!("OUT_DIR"), "/generated.rs"))
}

fn release() -> &'static str {
    env!("RDMA_VERBS_SYS_HEADERS_RELEASE")
}

#[test]
fn committed_bindings_equal_the_oldest_headers() {
    if release() != OLDEST {
        eprintln!("headers of rdma-core {}: see the subset test", release());
        return;
    }
    assert!(
        generated() == committed(),
        "src/bindings/{} is stale: run ibverbs-sys/regenerate-bindings.sh and commit",
        env!("RDMA_VERBS_SYS_BINDINGS")
    );
}

/// Every named item of a bindings file, as text keyed by kind and name:
/// consts (also those of `impl` blocks of the flag newtypes), type
/// aliases, function signatures, and struct/union fields.
fn items(src: &str) -> BTreeMap<String, String> {
    let file = syn::parse_file(src).expect("bindings parse");
    let mut out = BTreeMap::new();
    let text = |t: &dyn quote::ToTokens| t.to_token_stream().to_string();
    for item in &file.items {
        match item {
            syn::Item::Const(c) if c.ident != "_" => {
                out.insert(format!("const {}", c.ident), text(&c.expr));
            }
            syn::Item::Type(t) => {
                out.insert(format!("type {}", t.ident), text(&t.ty));
            }
            syn::Item::Impl(i) if i.trait_.is_none() => {
                for ii in &i.items {
                    if let syn::ImplItem::Const(c) = ii {
                        out.insert(
                            format!("const {}::{}", text(&i.self_ty), c.ident),
                            text(&c.expr),
                        );
                    }
                }
            }
            syn::Item::ForeignMod(fm) => {
                for fi in &fm.items {
                    if let syn::ForeignItem::Fn(f) = fi {
                        let mut sig = f.sig.clone();
                        // Parameter names are documentation.
                        for input in sig.inputs.iter_mut() {
                            if let syn::FnArg::Typed(pt) = input {
                                *pt.pat = syn::parse_quote!(_);
                            }
                        }
                        out.insert(format!("fn {}", f.sig.ident), text(&sig));
                    }
                }
            }
            syn::Item::Struct(s) => {
                let n = s.fields.len();
                for (i, f) in s.fields.iter().enumerate() {
                    let name = f
                        .ident
                        .as_ref()
                        .map(|i| i.to_string())
                        .unwrap_or(i.to_string());
                    // `struct verbs_context` grows at its start: the
                    // `ibv_context` it embeds stays last, and the inline
                    // verbs reach the ops back from it. Compared from the end.
                    let key = if s.ident == "verbs_context" {
                        format!("struct {}[end-{:03}]", s.ident, n - 1 - i)
                    } else {
                        format!("struct {}[{i:03}]", s.ident)
                    };
                    out.insert(key, format!("{name}: {}", text(&f.ty)));
                }
            }
            syn::Item::Union(u) => {
                for (i, f) in u.fields.named.iter().enumerate() {
                    let name = f.ident.as_ref().unwrap();
                    out.insert(
                        format!("union {}[{i:03}]", u.ident),
                        format!("{name}: {}", text(&f.ty)),
                    );
                }
            }
            _ => {}
        }
    }
    out
}

/// bindgen names anonymous types by their position (`…__bindgen_ty_3`): a
/// newer header that adds one renumbers the later ones. Such names compare
/// by their parent only.
fn anonymous(key: &str) -> bool {
    key.contains("__bindgen_ty_")
}

#[test]
fn committed_bindings_are_a_subset_of_newer_headers() {
    let newer = items(generated());
    let ours = items(&committed());
    let mut differ = Vec::new();
    for (key, value) in &ours {
        if anonymous(key) || anonymous(value) {
            continue;
        }
        match newer.get(key) {
            Some(v) if v == value => {}
            Some(v) => differ.push(format!("{key}: ours `{value}`, headers `{v}`")),
            None => differ.push(format!("{key}: not in the headers")),
        }
    }
    assert!(
        differ.is_empty(),
        "rdma-core {} headers disagree with the committed bindings:\n{}",
        release(),
        differ.join("\n")
    );
}

#[test]
fn newer_items_match_the_headers_that_have_them() {
    let Ok(release) = release().parse::<u32>() else {
        eprintln!("release of the headers unknown: set IBVERBS_RELEASE");
        return;
    };
    let newer = items(generated());
    if release < rdma_verbs_sys::FLUSH_RELEASE {
        assert!(!newer.contains_key("const IBV_WR_FLUSH"));
        return;
    }
    use rdma_verbs_sys as sys;
    let expect = [
        ("const IBV_WC_FLUSH", sys::IBV_WC_FLUSH as u64),
        ("const IBV_WR_FLUSH", sys::IBV_WR_FLUSH as u64),
        ("const IBV_FLUSH_GLOBAL", sys::IBV_FLUSH_GLOBAL as u64),
        (
            "const IBV_FLUSH_PERSISTENT",
            sys::IBV_FLUSH_PERSISTENT as u64,
        ),
        ("const IBV_FLUSH_RANGE", sys::IBV_FLUSH_RANGE as u64),
        ("const IBV_FLUSH_MR", sys::IBV_FLUSH_MR as u64),
        (
            "const ibv_access_flags::IBV_ACCESS_FLUSH_GLOBAL",
            sys::ibv_access_flags::IBV_ACCESS_FLUSH_GLOBAL.0 as u64,
        ),
        (
            "const ibv_access_flags::IBV_ACCESS_FLUSH_PERSISTENT",
            sys::ibv_access_flags::IBV_ACCESS_FLUSH_PERSISTENT.0 as u64,
        ),
        (
            "const ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_FLUSH",
            sys::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_FLUSH.0 as u64,
        ),
    ];
    for (key, ours) in expect {
        let theirs = newer
            .get(key)
            .unwrap_or_else(|| panic!("{key} not in the headers"));
        let digits: String = theirs
            .trim_start_matches("ibv_access_flags")
            .trim_start_matches("ibv_qp_create_send_ops_flags")
            .chars()
            .filter(|c| c.is_ascii_digit())
            .collect();
        let value: u64 = digits
            .parse()
            .unwrap_or_else(|_| panic!("{key} = {theirs}"));
        assert_eq!(value, ours, "{key}");
    }
    // wr_flush directly follows rdma-core 44's last field.
    let fields: Vec<_> = newer
        .iter()
        .filter(|(k, _)| k.starts_with("struct ibv_qp_ex["))
        .map(|(_, v)| v.split(':').next().unwrap().to_string())
        .collect();
    let pos = |name: &str| fields.iter().position(|f| f == name);
    let atomic_write = pos("wr_atomic_write").expect("wr_atomic_write");
    assert_eq!(pos("wr_flush"), Some(atomic_write + 1), "{fields:?}");
}
