//! Whether rdma-core's libraries are there (feature `dlopen`); without the
//! feature they are linked and these checks compile to nothing.

use crate::error::Result;

/// Loads libibverbs if it is not yet loaded (feature `dlopen`): called by
/// every way into the library that does not go through a
/// [`Context`](crate::Context) (which proves it loaded). Not on the data
/// path.
///
/// # Errors
/// [`Error::LibraryNotFound`](crate::Error::LibraryNotFound) naming
/// `libibverbs.so.1`.
#[inline]
pub(crate) fn ensure_loaded() -> Result<()> {
    rdma_verbs_sys::load().map_err(Into::into)
}

/// Loads librdmacm (and libibverbs, which it needs) if not yet loaded.
///
/// # Errors
/// [`Error::LibraryNotFound`](crate::Error::LibraryNotFound) naming the
/// library missing (libibverbs first).
#[cfg(feature = "rdmacm")]
#[inline]
pub(crate) fn ensure_rdmacm_loaded() -> Result<()> {
    rdma_verbs_sys::load_rdmacm().map_err(Into::into)
}
