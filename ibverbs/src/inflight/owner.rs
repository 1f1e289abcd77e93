//! Owner tags: a mark a library built on the core puts on the requests it
//! posts, so that it knows its completions from anyone else's whatever
//! their `wr_id`.

use std::num::NonZeroU8;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Error, Result};

/// The tags given so far (0 is "no owner", `u8::MAX` marks an orphan
/// completion in the in-flight store).
static GIVEN: AtomicU8 = AtomicU8::new(0);

/// The most tags a process may have.
pub const MAX_OWNERS: u8 = u8::MAX - 1;

/// A mark for the requests one library or subsystem posts
/// ([`SendRequest::owner`](crate::SendRequest::owner),
/// [`RecvRequest::owner`](crate::RecvRequest::owner)), carried by the
/// request's slot in the in-flight store to its completion
/// ([`Completion::is_owned_by`](crate::Completion::is_owned_by)).
///
/// The tag cannot be forged or read back: an `Owner` is only made by
/// [`Owner::new`], each one different, and a completion only says whether
/// it carries a given tag. So a subsystem that keeps its `Owner` private
/// knows that a completion with its tag came from one of its own posts,
/// whatever its `wr_id` (a caller posting directly on the same queue pair
/// with the same `wr_id` cannot pass for it). A refused request comes back
/// without its tag.
///
/// A process has at most [`MAX_OWNERS`] tags and never frees one: make one
/// per subsystem (a `static`), not per object, and tell your own objects
/// apart by the `wr_id` you give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner(NonZeroU8);

impl Owner {
    /// A new tag, different from every other of the process.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] (`what: "owner tags"`) once [`MAX_OWNERS`]
    /// were made.
    pub fn new() -> Result<Owner> {
        let given = GIVEN.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < MAX_OWNERS).then_some(n + 1)
        });
        match given {
            Ok(n) => Ok(Owner(NonZeroU8::new(n + 1).expect("n + 1 > 0"))),
            Err(n) => Err(Error::OutOfRange {
                what: "owner tags",
                value: u64::from(n) + 1,
                max: u64::from(MAX_OWNERS),
            }),
        }
    }

    /// The byte the in-flight store keeps.
    #[inline]
    pub(crate) fn tag(self) -> u8 {
        self.0.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_differ_and_never_take_the_store_s_own_values() {
        let (a, b) = (Owner::new().unwrap(), Owner::new().unwrap());
        assert_ne!(a, b);
        assert!(a.tag() != 0 && a.tag() != u8::MAX && b.tag() != u8::MAX);
    }
}
