//! Proofs that the safe API closes RDMA's memory hazards at compile time.
//!
//! Each section shows code the compiler **rejects** and its compiling twin:
//! the right way to do the same thing. The rejected code is a UI test,
//! `ibverbs/tests/ui/NN_*.rs`, shown here from that file (so rustdoc marks
//! it untested). `ibverbs/tests/hazards.rs` (trybuild) compiles each one and
//! compares the compiler's whole output with the `.stderr` file beside it:
//! error code, message and line. A proof that starts failing for another
//! reason (a typo, a renamed method, another error) no longer matches, and
//! the suite fails; stable rustdoc's `compile_fail,EXXXX` never checked the
//! code. The compiling twins are `no_run` doctests. The run-time half of the
//! story (stale completions, flushes, queue limits, `mem::forget`) is
//! covered by the device tests; see `DESIGN.md`. The proofs about the
//! runtime blocks (sections 20–21 and 25–30) are `rdma-verbs-runtime`'s
//! `hazards`.
//!
//! # 1. Using a buffer after posting it
//!
//! Posting moves the buffer into the work request; it is unreachable until the completion hands it back.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/01_use_buffer_after_post.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let mut rq = qp.recv_queue()?;
//! let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
//! rq.recv(buf, 1)?;
//! let mut done = Completions::with_capacity(1);
//! let mut buf = loop {
//!     if let Some(mut c) = cq.poll(&mut done)?.next() {
//!         c.result()?;
//!         break c.take_local().unwrap();
//!     }
//! };
//! buf[0] = 1; // ours again
//! # Ok(()) }
//! ```
//!
//! # 2. Freeing a buffer while it is posted
//!
//! Dropping needs ownership, which the posted request has.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/02_free_buffer_while_posted.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
//! drop(buf); // never posted: frees the registration and the memory
//! # Ok(()) }
//! ```
//!
//! # 3. Keeping a slice across the post
//!
//! A borrow of the buffer cannot outlive its move into the request.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/03_slice_across_post.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
//! let first = buf[0]; // copy out before posting
//! let mut rq = qp.recv_queue()?;
//! rq.recv(buf, 1)?;
//! println!("{first}");
//! # Ok(()) }
//! ```
//!
//! # 4. Reusing the storage after registration
//!
//! Registration consumes the storage; only the returned buffer reaches it.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/04_reuse_storage_after_registration.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let v = vec![0u8; 64];
//! let mut buf = pd.register(v, AccessFlags::LOCAL_WRITE)?;
//! buf[0] = 1;
//! # Ok(()) }
//! ```
//!
//! # 5. Borrowing the storage across registration
//!
//! No reference into the storage survives its registration.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/05_borrow_storage_across_registration.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let v = vec![0u8; 64];
//! let len = v.len();
//! let buf = pd.register(v, AccessFlags::LOCAL_WRITE)?;
//! assert_eq!(buf.len(), len);
//! # Ok(()) }
//! ```
//!
//! # 6. Remote-writable memory as a slice
//!
//! A `SharedBuffer` (remote write or atomic rights) has no `Deref`: a peer could change the bytes behind the reference.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/06_shared_buffer_as_slice.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let shared = pd.register_shared(vec![0u8; 64],
//!     AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let mut bytes = [0u8; 64];
//! shared.copy_to_slice(0, &mut bytes)?; // volatile copy
//! # Ok(()) }
//! ```
//!
//! # 7. Indexing remote-writable memory
//!
//! Neither reads nor writes through `[]` exist for a `SharedBuffer`.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/07_index_shared_buffer.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let mut shared = pd.register_shared(vec![0u8; 64],
//!     AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC)?;
//! shared.copy_from_slice(0, &[1])?;
//! let word = shared.atomic_u64(8)?; // what peers' atomics operate on
//! word.load(std::sync::atomic::Ordering::Acquire);
//! # Ok(()) }
//! ```
//!
//! # 8. Receiving into a frozen buffer
//!
//! A `FrozenBuffer` may be read through clones while posted, so the device must never write it: it is not `DeviceWritable`.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/08_recv_into_frozen_buffer.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let frozen = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?.freeze();
//! let mut sq = qp.send_queue()?;
//! sq.send(frozen.clone(), Wr::id(1))?; // the device only reads it
//! println!("{}", frozen[0]);           // and so may we
//! # Ok(()) }
//! ```
//!
//! # 9. RDMA read into a frozen buffer
//!
//! RDMA read results are device writes.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/09_rdma_read_into_frozen_buffer.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
//! let mut sq = qp.send_queue()?;
//! sq.read(buf, remote, Wr::id(1))?;
//! # Ok(()) }
//! ```
//!
//! # 10. Atomic result into a frozen buffer
//!
//! The original value of an atomic lands in the local buffer.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/10_atomic_result_into_frozen_buffer.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let result = pd.register(vec![0u8; 8], AccessFlags::LOCAL_WRITE)?;
//! let mut sq = qp.send_queue()?;
//! sq.fetch_and_add(result, remote, 1, Wr::id(1))?;
//! # Ok(()) }
//! ```
//!
//! # 11. Writing to a frozen buffer
//!
//! Frozen means read-only: no `DerefMut`. Unfreeze once no clone (and so no posted request) holds it.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/11_write_frozen_buffer.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let frozen = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?.freeze();
//! if let Ok(mut buf) = frozen.try_unfreeze() {
//!     buf[0] = 1;
//! }
//! # Ok(()) }
//! ```
//!
//! # 12. Inline data that dies before the post
//!
//! A [`SendRequest`](crate::SendRequest) with inline data (for a chain)
//! borrows its bytes until `post_chain` copies them; the typed
//! `send_inline`/`write_inline` copy them before they return.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/12_inline_data_dies_before_post.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let mut sq = qp.send_queue()?;
//! let data = vec![1u8; 16];
//! sq.send_inline(&data, Wr::id(1))?; // copied before it returns
//! let mut chain = vec![SendRequest::send_inline(&data)];
//! sq.post_chain(&mut chain)?; // copied into the work request during the post
//! drop(chain);
//! drop(data);
//! # Ok(()) }
//! ```
//!
//! # 13. Using the halves' parent after a split
//!
//! `split_at` consumes the buffer; each half owns a disjoint range.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/13_use_parent_after_split.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
//! let (a, mut b) = buf.split_at(32);
//! let mut rq = qp.recv_queue()?;
//! rq.recv(a, 1)?; // the device writes the first half
//! b[0] = 1;       // while we use the second
//! # Ok(()) }
//! ```
//!
//! # 14. Raw polling that would swallow safe completions
//!
//! `poll_raw` passes the provider's entries through untouched: a safe
//! request's completion consumed there would never hand its buffers back
//! (and its `wr_id` is the library's tag). It is `unsafe`, with a contract.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/14_poll_raw_in_safe_code.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let mut done = Completions::with_capacity(16);
//! for mut c in cq.poll(&mut done)? { // every completion claimed,
//!     let _buffers = c.take_buffers(); // its buffers back
//! }
//! # Ok(()) }
//! ```
//!
//! # 15. A typed view across the post
//!
//! `as_slice_of`/`as_mut_slice_of` borrow the buffer: the view cannot
//! outlive its move into a request.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/15a_typed_view_across_recv.rs")]
//! ```
//!
//! ```ignore
#![doc = include_str!("../tests/ui/15b_mut_typed_view_across_send.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let mut buf = pd.alloc(64, AccessFlags::LOCAL_WRITE)?;
//! buf.as_mut_slice_of::<u32>()?[0] = 1; // the view ends here
//! let first = buf.as_slice_of::<f32>()?[0]; // a copy
//! let mut sq = qp.send_queue()?;
//! sq.send(buf, Wr::id(1))?;
//! println!("{first}");
//! # Ok(()) }
//! ```
//!
//! # 16. Two typed views of one buffer, one of them mutable
//!
//! The views follow the borrow rules of the buffer: no `&[T]` aliases a
//! `&mut [U]`.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/16_two_typed_views_one_mutable.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let mut buf = pd.alloc(64, AccessFlags::LOCAL_WRITE)?;
//! let w = buf.as_slice_of::<u32>()?[0];
//! buf.as_mut_slice_of::<f32>()?[0] = w as f32;
//! # Ok(()) }
//! ```
//!
//! # 17. A typed view of remote-writable memory
//!
//! A peer may write a [`SharedBuffer`](crate::SharedBuffer) at any time:
//! it has no typed view, only typed copies (`read_into`, `write_from`).
//!
//! ```ignore
#![doc = include_str!("../tests/ui/17_typed_view_of_shared_buffer.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let shared = pd.alloc_shared(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! let mut words = [0u32; 16];
//! shared.read_into(0, &mut words)?; // volatile copies
//! # Ok(()) }
//! ```
//!
//! # 18. Using chunks after joining them
//!
//! `join` consumes the pieces; only the joined buffer reaches their bytes.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/18_use_chunks_after_join.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let (mut chunks, _) = pd.alloc(64, AccessFlags::LOCAL_WRITE)?.chunks_exact(16);
//! let last = chunks.pop().unwrap();
//! let mut rq = qp.recv_queue()?;
//! rq.recv(last, 1)?; // the device writes one chunk
//! chunks[0][0] = 1;  // while we use another
//! # Ok(()) }
//! ```
//!
//! # 19. Keeping a buffer across posting it in a chain
//!
//! A chain ([`SendQueue::post_chain`](crate::SendQueue::post_chain) of a
//! `Vec<SendRequest>`) moves each buffer into its
//! request as a single request does; the posted requests leave the `Vec`,
//! so nothing in it reaches a posted buffer either.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/19_view_across_chain_post.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let buf = pd.register(vec![0u8; 64], AccessFlags::LOCAL_WRITE)?;
//! let first = buf[0];
//! let mut chain = vec![SendRequest::write(buf, remote)];
//! let mut sq = qp.send_queue()?;
//! sq.post_chain(&mut chain)?;
//! assert!(chain.is_empty()); // every request posted: its buffer is the QP's
//! println!("{first}");
//! # Ok(()) }
//! ```
//!
//! # 22. Touching a pooled buffer while it is posted
//!
//! Posting a [`PooledBuffer`](crate::memory::PooledBuffer) moves it into the
//! request (as the plain buffer it wraps): the queue pair owns it, not
//! the pool and not the caller, until the completion hands it back.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/22_touch_pooled_buffer_while_posted.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs::memory::BufferPool;
//! # fn f(pool: &BufferPool, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let buf = pool.get().unwrap();
//! let mut rq = qp.recv_queue()?;
//! rq.recv(buf, 1)?;
//! let mut done = Completions::with_capacity(1);
//! let mut buf = loop {
//!     if let Some(mut c) = cq.poll(&mut done)?.next() {
//!         break c.take_local().unwrap();
//!     }
//! };
//! buf[0] = 1; // ours again, until it goes back
//! pool.put(buf)?;
//! # Ok(()) }
//! ```
//!
//! # 23. Using a buffer after it went back to the pool
//!
//! [`BufferPool::put`](crate::memory::BufferPool::put) and dropping a
//! [`PooledBuffer`](crate::memory::PooledBuffer) consume it: the next `get`, on
//! any thread, may hand the same bytes to someone else.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/23a_use_buffer_after_put.rs")]
//! ```
//!
//! ```ignore
#![doc = include_str!("../tests/ui/23b_use_pooled_buffer_after_drop.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs::memory::BufferPool;
//! # fn f(pool: &BufferPool, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let buf = pool.get().unwrap();
//! let first = buf[0]; // copy out what is needed
//! drop(buf);          // back in the pool
//! println!("{first}");
//! # Ok(()) }
//! ```
//!
//! # 24. Keeping a view of a pooled buffer after giving it back
//!
//! A slice or typed view borrows the [`PooledBuffer`](crate::memory::PooledBuffer),
//! so it cannot outlive the drop that returns the bytes to the pool (or
//! the post that hands them to the device).
//!
//! ```ignore
#![doc = include_str!("../tests/ui/24a_typed_view_after_pooled_drop.rs")]
//! ```
//!
//! ```ignore
#![doc = include_str!("../tests/ui/24b_view_across_pooled_post.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs::memory::BufferPool;
//! # fn f(pool: &BufferPool, qp: &QueuePair, cq: &CompletionQueue, remote: RemoteMemory) -> Result<()> {
//! let buf = pool.get().unwrap();
//! let first = buf.as_slice_of::<u32>()?[0];
//! let mut sq = qp.send_queue()?;
//! sq.write(buf, remote, Wr::id(1))?;
//! println!("{first}");
//! # Ok(()) }
//! ```
//!
//! # 31. Registering a dmabuf, or reading its bytes, from safe code
//!
//! A dmabuf's memory belongs to its exporter and may be mapped elsewhere
//! in the process: what makes registering it sound is outside what the
//! crate can see, so [`ProtectionDomain::register_dmabuf`](crate::ProtectionDomain::register_dmabuf)
//! is `unsafe`, and the region it returns has no bytes to hand out
//! (DESIGN.md, "dmabuf regions and chosen IOVAs").
//!
//! ```ignore
#![doc = include_str!("../tests/ui/31a_register_dmabuf_in_safe_code.rs")]
//! ```
//!
//! ```ignore
#![doc = include_str!("../tests/ui/31b_index_dmabuf_region.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs::memory::DmabufRegion;
//! # fn f(r: &DmabufRegion) {
//! let _for_the_peer = r.remote(); // keys and device addresses only
//! # }
//! ```
//!
//! # 32. Registering the whole address space from safe code
//!
//! An implicit on-demand-paging region's keys name every byte of the
//! process, those behind live references included: what makes it sound is
//! the caller's use of the keys, so
//! [`ProtectionDomain::register_implicit_odp`](crate::ProtectionDomain::register_implicit_odp)
//! is `unsafe` (DESIGN.md, "On-demand paging, XRC, re-registration").
//!
//! ```ignore
#![doc = include_str!("../tests/ui/32_register_implicit_odp_in_safe_code.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain) -> Result<()> {
//! // SAFETY: the lkey goes only into raw posts whose contracts hold for
//! // every address used; no remote rights, so no peer gets a key.
//! let all = unsafe { pd.register_implicit_odp(AccessFlags::LOCAL_WRITE)? };
//! let _lkey = all.lkey();
//! # Ok(()) }
//! ```
//!
//! # 33. Re-registering a region while the device may use it
//!
//! `rereg_access` takes the buffer mutably, so a posted buffer (moved into
//! the request) cannot be re-registered; a region something else still
//! holds (a split piece, a `MemoryRegion`, a window, a prepared request) is
//! refused at run time (`Error::RegionInUse`).
//!
//! ```ignore
#![doc = include_str!("../tests/ui/33_rereg_posted_buffer.rs")]
//! ```
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(pd: &ProtectionDomain, qp: &QueuePair, cq: &CompletionQueue) -> Result<()> {
//! let buf = pd.alloc(4096, AccessFlags::LOCAL_WRITE)?;
//! let mut sq = qp.send_queue()?;
//! sq.send(buf, Wr::id(1))?;
//! let mut done = Completions::with_capacity(1);
//! let mut buf = loop {
//!     if let Some(mut c) = cq.poll(&mut done)?.next() {
//!         break c.take_local().unwrap();
//!     }
//! };
//! buf.rereg_access(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?; // ours again
//! # Ok(()) }
//! ```
//!
//! # 34. Reading the library's event descriptors from safe code
//!
//! An event read from a descriptor past the library is never acknowledged,
//! and the destroy verbs wait for every acknowledgement; rdma_ucm's
//! `write(2)` commands carry pointers the kernel writes through. So
//! `Context`, `CompletionChannel` and `cm::EventChannel` lend their
//! descriptors only through `AsRawFd` (any I/O on a raw fd is `unsafe`),
//! never as a `BorrowedFd` (DESIGN.md, threat model: descriptors lent out).
//!
//! ```ignore
#![doc = include_str!("../tests/ui/34a_read_context_async_fd.rs")]
//! ```
//!
//! ```ignore
#![doc = include_str!("../tests/ui/34b_read_completion_channel_fd.rs")]
//! ```
//!
//! ```ignore
#![doc = include_str!("../tests/ui-rdmacm/34c_write_cm_event_channel_fd.rs")]
//! ```
//!
//! Readiness needs no I/O: register the raw fd with epoll or Tokio.
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(ctx: &Context) -> Result<()> {
//! use std::os::fd::AsRawFd;
//! let fd = ctx.as_raw_fd(); // for epoll / tokio::io::unix::AsyncFd
//! # let _ = fd;
//! ctx.set_async_nonblocking(true)?;
//! let _event = ctx.get_async_event(); // read through libibverbs, acknowledged
//! # Ok(()) }
//! ```
//!
//! # 35. Holding a polled completion across the next poll
//!
//! [`CompletionQueue::poll`](crate::CompletionQueue::poll) lends its
//! completions from the [`Completions`](crate::Completions) storage it
//! polled into: a [`CompletionRef`](crate::cq::CompletionRef) borrows its
//! entry there, so it cannot be kept across the next poll into the same
//! storage (which overwrites the entries), nor outlive the storage.
//!
//! ```ignore
#![doc = include_str!("../tests/ui/35a_completion_across_next_poll.rs")]
//! ```
//!
//! ```ignore
#![doc = include_str!("../tests/ui/35b_completion_outlives_storage.rs")]
//! ```
//!
//! Take what is needed during the walk, or keep the completion as an owned
//! [`Completion`](crate::Completion):
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # use rdma_verbs::cq::CompletionRef;
//! # fn f(cq: &CompletionQueue) -> Result<()> {
//! let mut done = Completions::with_capacity(16);
//! let kept: Vec<Completion> = cq.poll(&mut done)?.map(CompletionRef::into_owned).collect();
//! for c in cq.poll(&mut done)? { // the storage is free again
//!     println!("{}", c.wr_id());
//! }
//! for mut c in kept {
//!     c.result()?;
//!     let _buf = c.take_local();
//! }
//! # Ok(()) }
//! ```
//!
//! # 36. Two threads posting through one send queue handle
//!
//! A [`SendQueue`](crate::SendQueue) owns its queue's ring without a lock:
//! every post takes it `&mut`, so two threads cannot post through it at
//! once. (Taking a second handle of the same queue is refused at run time,
//! `Error::QueueTaken`.)
//!
//! ```ignore
#![doc = include_str!("../tests/ui/36_two_threads_one_send_queue.rs")]
//! ```
//!
//! Share it in a `Mutex` (it is `Send + Sync`), or move it to one thread:
//!
//! ```no_run
//! # use rdma_verbs::*;
//! # fn f(qp: &QueuePair) -> Result<()> {
//! let sq = std::sync::Mutex::new(qp.send_queue()?);
//! std::thread::scope(|s| {
//!     s.spawn(|| sq.lock().unwrap().send_inline(b"one", Wr::id(1)));
//!     s.spawn(|| sq.lock().unwrap().send_inline(b"two", Wr::id(2)));
//! });
//! # Ok(()) }
//! ```
