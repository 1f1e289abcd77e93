//! The `dlopen` feature's code generator, run by `tests/dlgen.rs`: it
//! writes (with `IBVERBS_SYS_UPDATE_BINDINGS` set) or checks the committed
//! `src/bindings/*_dlopen.rs`.
//!
//! Input: the committed bindings and `src/bindings/extra.rs`. Output: the
//! same bindings where each declaration of an exported function becomes a
//! Rust function of the same name and signature that calls the symbol
//! through `dlsym` (resolved once, see `src/dl.rs`), and the list of the
//! wrapped symbols.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};

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
    /// The Rust function's name (the symbol's, except for `extra.rs`).
    pub rust_name: String,
    pub lib: Lib,
    /// What the wrapper returns when the symbol is missing (Rust source).
    pub missing: String,
}

/// The generator's output.
pub struct Generated {
    /// Bindings with the exported functions replaced by wrappers.
    pub rust: String,
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
/// the module docs. `extra` (`extra.rs`) is parsed the same way.
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
    Ok(Generated {
        rust: out.to_string(),
        symbols,
    })
}
