//! The `dlopen` feature's code generator, shared by `build.rs` and the
//! crate's tests (`tests/dlgen.rs`).
//!
//! Input: the bindings bindgen generated (unchanged, so the committed
//! snapshot is the same with and without the feature). Output:
//! * the same bindings where each declaration of an *exported* function
//!   (an `extern "C"` item without a `link_name`, or with a `link_name`
//!   that does not end in `__extern`) becomes a Rust function of the same
//!   name and signature that calls the symbol through `dlsym` (resolved
//!   once, see `src/dl.rs`); the declarations of the C shim's wrappers
//!   (`link_name = "…__extern"`, bindgen's `wrap_static_fns`) stay
//!   `extern "C"`: they are linked statically;
//! * a C header, force-included when the shim is compiled, that renames
//!   every exported function the shim's inlines might call to the Rust
//!   forwarder `rdmaverbs_sys_dl_<name>` (each generated function carries
//!   that `export_name`), so the shim names no symbol of libibverbs or
//!   librdmacm and the binary has no `DT_NEEDED` on them.

use std::fmt::Write as _;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};

/// Prefix of the forwarders' symbol names (`export_name`).
pub const FORWARDER_PREFIX: &str = "rdmaverbs_sys_dl_";

/// Exported functions that `verbs.h` also defines as function-like macros
/// of the same name (declared and called before the macro is defined):
/// an object-like `#define` would be redefined by `verbs.h`, so the
/// header renames these with asm labels on a prior declaration instead.
pub const MACRO_NAMED: &[(&str, &str)] = &[
    (
        "ibv_get_device_list",
        "struct ibv_device **ibv_get_device_list(int *num_devices)",
    ),
    (
        "ibv_query_port",
        "int ibv_query_port(struct ibv_context *context, uint8_t port_num, \
         struct _compat_ibv_port_attr *port_attr)",
    ),
    (
        "ibv_reg_mr",
        "struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)",
    ),
    (
        "ibv_reg_mr_iova",
        "struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, \
         uint64_t iova, int access)",
    ),
];

/// Exported functions the bindings do not declare (they are blocklisted:
/// `lib.rs` defines Rust functions of these names over the inlines), but
/// which the inlines call: declared here under a private Rust name with
/// the symbol in `link_name`, so that they get forwarders too.
pub const EXTRA_DECLS: &str = r#"
unsafe extern "C" {
    #[link_name = "ibv_query_port"]
    pub(crate) fn dl_compat_ibv_query_port(
        context: *mut ibv_context,
        port_num: u8,
        port_attr: *mut ::core::ffi::c_void,
    ) -> ::core::ffi::c_int;
    #[link_name = "ibv_reg_mr"]
    pub(crate) fn dl_exported_ibv_reg_mr(
        pd: *mut ibv_pd,
        addr: *mut ::core::ffi::c_void,
        length: usize,
        access: ::core::ffi::c_int,
    ) -> *mut ibv_mr;
    #[link_name = "ibv_reg_mr_iova"]
    pub(crate) fn dl_exported_ibv_reg_mr_iova(
        pd: *mut ibv_pd,
        addr: *mut ::core::ffi::c_void,
        length: usize,
        iova: u64,
        access: ::core::ffi::c_int,
    ) -> *mut ibv_mr;
}
"#;

/// `int` verbs of libibverbs that report failure as `-1` with `errno`
/// (the others return an errno value); every `rdma_*` verb of librdmacm
/// does too.
const MINUS_ONE: &[&str] = &[
    "ibv_get_async_event",
    "ibv_get_cq_event",
    "ibv_query_gid",
    "ibv_query_pkey",
    "ibv_get_pkey_index",
    "ibv_get_device_index",
    "ibv_rate_to_mult",
    "ibv_rate_to_mbps",
    "ibv_init_ah_from_wc",
];

/// `int` verbs whose "unsupported" answer is 0 rather than an error.
const ZERO: &[&str] = &["ibv_query_qp_data_in_order"];

/// Which library exports a symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    Ibverbs,
    Rdmacm,
}

impl Lib {
    /// The library a symbol belongs to, by its prefix.
    pub fn of(symbol: &str) -> Lib {
        if symbol.starts_with("rdma") {
            Lib::Rdmacm
        } else {
            Lib::Ibverbs
        }
    }
}

/// One exported function that got a `dlsym` wrapper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// The C symbol (`dlsym` name).
    pub symbol: String,
    /// The Rust function's name (the symbol's, except for [`EXTRA_DECLS`]).
    pub rust_name: String,
    pub lib: Lib,
    /// What the wrapper returns when the symbol is missing (Rust source).
    pub missing: String,
}

/// The generator's output.
pub struct Generated {
    /// Bindings with the exported functions replaced by wrappers.
    pub rust: String,
    /// The header force-included before `verbs.h` when the shim is compiled.
    pub header: String,
    pub symbols: Vec<Symbol>,
}

fn link_name(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| {
        let syn::Meta::NameValue(nv) = &a.meta else {
            return None;
        };
        if !nv.path.is_ident("link_name") {
            return None;
        }
        match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value().trim_start_matches('\u{1}').to_string()),
            _ => None,
        }
    })
}

/// The value a wrapper returns when its symbol is missing (errno is set
/// to `EOPNOTSUPP` as well): nothing for `void`; a static `"unknown"` for
/// the `*_str` functions (their callers read the string); NULL for other
/// pointers; for `int`, `-1` where the verb's convention is `-1` with
/// `errno` ([`MINUS_ONE`], every `rdma_*` verb), 0 for [`ZERO`], else
/// `EOPNOTSUPP` (the errno-returning convention of the modern verbs); a
/// negative `EOPNOTSUPP` for `ssize_t`; zero for anything else (`__be64`
/// GUIDs, `ibv_fork_status`: `IBV_FORK_DISABLED`).
pub fn missing_value(name: &str, output: &syn::ReturnType) -> String {
    let syn::ReturnType::Type(_, ty) = output else {
        return "()".into();
    };
    match &**ty {
        syn::Type::Ptr(_) if name.ends_with("_str") => "b\"unknown\\0\".as_ptr() as _".into(),
        syn::Type::Ptr(p) if p.mutability.is_some() => "::core::ptr::null_mut()".into(),
        syn::Type::Ptr(_) => "::core::ptr::null()".into(),
        syn::Type::Path(p) => {
            let last = p.path.segments.last().map(|s| s.ident.to_string());
            match last.as_deref() {
                Some("c_int") if ZERO.contains(&name) => "0".into(),
                Some("c_int") if name.starts_with("rdma") || MINUS_ONE.contains(&name) => {
                    "-1".into()
                }
                Some("c_int") => "::libc::EOPNOTSUPP".into(),
                Some("isize" | "ssize_t" | "__ssize_t" | "c_long") => {
                    "-(::libc::EOPNOTSUPP as isize) as _".into()
                }
                // SAFETY: (of the generated block) the return types that reach
                // here are integers (GUIDs, fork status), for which all-zero is valid.
                _ => "unsafe { ::core::mem::zeroed() }".into(),
            }
        }
        // SAFETY: (of the generated block) as above, plain integer returns.
        _ => "unsafe { ::core::mem::zeroed() }".into(),
    }
}

fn wrapper(f: &syn::ForeignItemFn, symbol: &str, missing: &str) -> Result<TokenStream, String> {
    let sig = &f.sig;
    if sig.variadic.is_some() {
        return Err(format!("{symbol} is variadic: no dlsym wrapper"));
    }
    let name = &sig.ident;
    let vis = &f.vis;
    let docs: Vec<_> = f
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .collect();
    let mut params = Vec::new();
    let mut args = Vec::new();
    let mut types = Vec::new();
    for (i, input) in sig.inputs.iter().enumerate() {
        let syn::FnArg::Typed(pt) = input else {
            return Err(format!("{symbol}: unexpected receiver"));
        };
        let ident = match &*pt.pat {
            syn::Pat::Ident(pi) => pi.ident.clone(),
            _ => format_ident!("arg{}", i),
        };
        let ty = &pt.ty;
        params.push(quote!(#ident: #ty));
        args.push(quote!(#ident));
        types.push(quote!(#ty));
    }
    let output = &sig.output;
    let export = format!("{FORWARDER_PREFIX}{symbol}");
    let lib = match Lib::of(symbol) {
        Lib::Ibverbs => quote!(LIBIBVERBS),
        Lib::Rdmacm => quote!(LIBRDMACM),
    };
    let cname = syn::LitCStr::new(
        &std::ffi::CString::new(symbol).map_err(|e| e.to_string())?,
        Span::call_site(),
    );
    let missing: TokenStream = missing.parse().map_err(|e| format!("{symbol}: {e}"))?;
    Ok(quote! {
        #(#docs)*
        ///
        /// Resolved at run time with `dlsym` (feature `dlopen`); when the
        /// library or the symbol is missing it sets `errno` to
        /// `EOPNOTSUPP` and returns the verb's failure value.
        #[export_name = #export]
        #vis unsafe extern "C" fn #name(#(#params),*) #output {
            static SLOT: crate::dl::Slot = crate::dl::Slot::new();
            match SLOT.get(&crate::dl::#lib, #cname) {
                // SAFETY: `f` is the address dlsym returned for this C
                // function, whose prototype is the one bindgen read from
                // the same headers; the arguments are the caller's, under
                // the verb's own contract.
                Some(f) => unsafe {
                    let f: unsafe extern "C" fn(#(#types),*) #output = ::core::mem::transmute(f);
                    f(#(#args),*)
                },
                None => {
                    crate::dl::set_errno(::libc::EOPNOTSUPP);
                    #missing
                }
            }
        }
    })
}

/// Rewrites `bindings` (bindgen's output) for the `dlopen` feature; see
/// the module docs. `extra` is parsed the same way ([`EXTRA_DECLS`]).
pub fn transform(bindings: &str, extra: &str) -> Result<Generated, String> {
    let mut file: syn::File = syn::parse_str(bindings).map_err(|e| format!("bindings: {e}"))?;
    let extra: syn::File = syn::parse_str(extra).map_err(|e| format!("extra: {e}"))?;
    file.items.extend(extra.items);
    let mut out = TokenStream::new();
    let mut symbols = Vec::new();
    for item in file.items {
        let syn::Item::ForeignMod(fm) = item else {
            out.extend(quote!(#item));
            continue;
        };
        let mut kept = Vec::new();
        for fi in &fm.items {
            let syn::ForeignItem::Fn(f) = fi else {
                kept.push(fi.clone());
                continue;
            };
            let link = link_name(&f.attrs);
            if link.as_deref().is_some_and(|l| l.ends_with("__extern")) {
                kept.push(fi.clone());
                continue;
            }
            let rust_name = f.sig.ident.to_string();
            let symbol = link.unwrap_or_else(|| rust_name.clone());
            let missing = missing_value(&symbol, &f.sig.output);
            out.extend(wrapper(f, &symbol, &missing)?);
            symbols.push(Symbol {
                lib: Lib::of(&symbol),
                symbol,
                rust_name,
                missing,
            });
        }
        if !kept.is_empty() {
            let attrs = &fm.attrs;
            let unsafety = &fm.unsafety;
            let abi = &fm.abi;
            out.extend(quote!(#(#attrs)* #unsafety #abi { #(#kept)* }));
        }
    }
    let header = header(&symbols);
    Ok(Generated {
        rust: out.to_string(),
        header,
        symbols,
    })
}

/// The header force-included (`-include`) when the C shim is compiled.
pub fn header(symbols: &[Symbol]) -> String {
    let mut h = String::from(
        "/* Generated by ibverbs-sys/build/dlgen.rs (feature `dlopen`): every\n \
         * exported function an inline of verbs.h may call is renamed to its\n \
         * Rust forwarder, so the shim names no libibverbs/librdmacm symbol. */\n\
         #include <stddef.h>\n#include <stdint.h>\n\
         struct ibv_context; struct ibv_device; struct ibv_pd; struct ibv_mr;\n\
         struct _compat_ibv_port_attr;\n",
    );
    for (name, proto) in MACRO_NAMED {
        let _ = writeln!(h, "{proto} __asm__(\"{FORWARDER_PREFIX}{name}\");");
    }
    for s in symbols {
        if MACRO_NAMED.iter().any(|(n, _)| *n == s.symbol) {
            continue;
        }
        let _ = writeln!(h, "#define {0} {FORWARDER_PREFIX}{0}", s.symbol);
    }
    h
}
