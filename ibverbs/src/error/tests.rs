//! Host tests of the error type: every variant's Display, the `io::Error`
//! mapping, and `PostError`'s Display, source chain and `?` conversions.

use super::*;

#[test]
fn hints_keep_the_verb_and_the_errno() {
    let e = Error::from_errno("ibv_query_port", libc::EINVAL)
        .with_hint(Some("rxe0 has no port 0".into()));
    assert_eq!(e.verb(), Some("ibv_query_port"));
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    let text = e.to_string();
    assert!(
        text.starts_with("ibv_query_port failed: Invalid argument"),
        "{text}"
    );
    assert!(text.ends_with("; rxe0 has no port 0"), "{text}");
    // A second hint keeps the errno too; no hint changes nothing.
    let e = e.with_hint(Some("more".into()));
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    let e = Error::from_errno("ibv_reg_mr", libc::ENOMEM).with_hint(None);
    assert!(matches!(&e, Error::Verb { io, .. } if io.raw_os_error() == Some(libc::ENOMEM)));
    // Other variants are left alone.
    let e = Error::ReceivesThroughSrq.with_hint(Some("y".into()));
    assert!(matches!(e, Error::ReceivesThroughSrq));
    assert!(!e.to_string().contains('y'), "{e}");
}

/// One value of every variant. The match below has no wildcard: a new
/// variant does not compile until it is listed here.
fn every_variant() -> Vec<Error> {
    let all = vec![
        Error::from_errno("ibv_reg_mr", libc::ENOMEM),
        Error::WorkCompletion {
            status: WcStatus::RemAccessErr,
            wr_id: 7,
            vendor_err: 0x11,
        },
        Error::InvalidTransition {
            from: QpState::Reset,
            to: QpState::Rtr,
            reason: TransitionReason::NoSuchTransition,
        },
        Error::Unsupported("flux capacitors"),
        Error::QueueFull {
            queue: "send queue",
            depth: 16,
        },
        Error::NoDevice {
            name: Some("mlx5_9".into()),
        },
        Error::OpNotAvailable {
            op: SendOp::RdmaRead,
            qp_type: QpType::Uc,
        },
        Error::OptionNotAllowed {
            option: RequestOption::Immediate,
            op: SendOp::RdmaRead,
            qp_type: QpType::Rc,
        },
        Error::OptionRequired {
            option: RequestOption::UdDestination,
            op: SendOp::Send,
            qp_type: QpType::Ud,
        },
        Error::InlineTooLarge { len: 300, max: 256 },
        Error::UnsignaledExclusive { op: SendOp::Send },
        Error::WindowBusy,
        Error::WindowIndeterminate,
        Error::QueuePairInError {
            verb: "ibv_post_recv",
        },
        Error::CqTooSmall {
            capacity: 8,
            needed: 32,
            owed: 4,
        },
        Error::QueueHeldAfterReset {
            queue: "send queue",
            held: 3,
            depth: 16,
        },
        Error::NotReadyToSend {
            state: QpState::Init,
        },
        Error::TooManySges { got: 5, max: 4 },
        Error::OutOfRange {
            what: "local PSN",
            value: 1 << 24,
            max: 0xFF_FFFF,
        },
        Error::InvalidMtu { value: 9 },
        Error::Misaligned {
            addr: 0x1004,
            align: 8,
        },
        Error::OutOfBounds {
            offset: 60,
            len: 8,
            size: 64,
        },
        Error::AtomicResultBuffer {
            buffers: 2,
            len: 16,
        },
        Error::ForeignProtectionDomain { what: "buffer" },
        Error::ForeignContext {
            what: "completion queue",
        },
        Error::FrozenBuffer { op: "receive" },
        Error::MissingAccess {
            what: "a buffer the device writes",
            needed: AccessFlags::LOCAL_WRITE,
        },
        Error::NeedsSharedBuffer {
            what: "REMOTE_WRITE or REMOTE_ATOMIC access",
        },
        Error::AccessNotAllowed {
            what: "a memory window",
            flags: AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        },
        Error::UdMessageTooLong {
            len: 1025,
            mtu: 1024,
        },
        Error::ReceivesThroughSrq,
        Error::WrongQpType {
            what: "connect",
            qp_type: QpType::Ud,
        },
        Error::EmptyGid {
            port: PortNumber(1),
            index: GidIndex(3),
        },
        Error::MissingRemoteAddress {
            port: PortNumber(1),
            needed: "GID",
        },
        Error::PreparedUnsignaled,
        Error::WrongOperation {
            expected: SendOp::FetchAndAdd,
        },
        Error::SendOpFlagsRequired {
            op: SendOp::AtomicWrite,
            needed: SendOpFlags::ATOMIC_WRITE,
        },
        Error::EmptyRegistration,
        Error::NullStorage,
        Error::WindowNotBound,
        Error::NoCompletionChannel {
            which: "AsyncQueuePair's send CQ",
        },
        Error::ConflictingOptions {
            first: "A",
            second: "B",
        },
        Error::QueuePairDropped,
        #[cfg(feature = "rdmacm")]
        Error::UnexpectedEvent {
            expected: crate::cm::CmEventType::Established,
            got: crate::cm::CmEventType::Rejected,
            status: 28,
        },
        Error::NoActivePort {
            device: "rxe0".into(),
        },
        Error::CompletionChannelShared { cqs: 2 },
        Error::BadWireFormat {
            what: "Endpoint",
            problem: crate::error::WireProblem::Version {
                version: 9,
                supported: 1,
            },
        },
        Error::NotThisQueuePair {
            qp_num: crate::types::QpNumber(17),
            endpoint: crate::types::QpNumber(18),
        },
        Error::LengthNotMultiple { len: 63, size: 4 },
        Error::NotPoolSlot {
            addr: 0x1800,
            len: 2048,
            size: 4096,
            same_registration: true,
        },
        Error::NoMatchingGid {
            port: PortNumber(1),
            wanted: crate::types::GidSelector::Netdev("eth9".into()),
        },
        Error::ForkInitTooLate {
            verb: "ibv_fork_init",
            refused_by_rdma_core: true,
        },
        Error::CqResizeTooSmall {
            verb: "ibv_resize_cq",
            requested: 15,
            registered: 16,
            owed: 0,
        },
        Error::DeviceLacks {
            verb: "ibv_modify_cq",
            capability: "CQ moderation (cq_mod_caps.max_cq_count is 0)",
        },
        Error::LibraryTooOld {
            verb: "ibv_wr_flush",
            needs: 45,
            found: Some(44),
        },
        Error::Sysfs {
            path: "/sys/class/infiniband/rxe0/ports/2".into(),
            io: io::Error::from_raw_os_error(libc::ENOENT),
        },
        Error::GrhRequired {
            port: PortNumber(1),
        },
        Error::MulticastMembership {
            verb: "ibv_detach_mcast",
            gid: crate::types::Gid::from(std::net::Ipv4Addr::new(239, 1, 1, 1)),
            lid: 0,
            attached: false,
        },
        Error::RegionInUse {
            verb: "ibv_rereg_mr",
        },
        Error::LibraryNotFound {
            library: "libibverbs.so.1",
            package: "libibverbs1",
        },
    ];
    for e in &all {
        match e {
            Error::Verb { .. }
            | Error::WorkCompletion { .. }
            | Error::InvalidTransition { .. }
            | Error::Unsupported(_)
            | Error::QueueFull { .. }
            | Error::QueueHeldAfterReset { .. }
            | Error::QueueTaken { .. }
            | Error::HandleLive { .. }
            | Error::NotThisQueue { .. }
            | Error::NoDevice { .. }
            | Error::OpNotAvailable { .. }
            | Error::OptionNotAllowed { .. }
            | Error::OptionRequired { .. }
            | Error::InlineTooLarge { .. }
            | Error::UnsignaledExclusive { .. }
            | Error::WindowBusy
            | Error::WindowIndeterminate
            | Error::QueuePairInError { .. }
            | Error::CqTooSmall { .. }
            | Error::NotReadyToSend { .. }
            | Error::TooManySges { .. }
            | Error::OutOfRange { .. }
            | Error::InvalidMtu { .. }
            | Error::Misaligned { .. }
            | Error::OutOfBounds { .. }
            | Error::AtomicResultBuffer { .. }
            | Error::ForeignProtectionDomain { .. }
            | Error::ForeignContext { .. }
            | Error::FrozenBuffer { .. }
            | Error::MissingAccess { .. }
            | Error::NeedsSharedBuffer { .. }
            | Error::AccessNotAllowed { .. }
            | Error::UdMessageTooLong { .. }
            | Error::ReceivesThroughSrq
            | Error::WrongQpType { .. }
            | Error::EmptyGid { .. }
            | Error::MissingRemoteAddress { .. }
            | Error::PreparedUnsignaled
            | Error::WrongOperation { .. }
            | Error::SendOpFlagsRequired { .. }
            | Error::EmptyRegistration
            | Error::NullStorage
            | Error::WindowNotBound
            | Error::NoCompletionChannel { .. }
            | Error::ConflictingOptions { .. }
            | Error::QueuePairDropped
            | Error::NoActivePort { .. }
            | Error::CompletionChannelShared { .. }
            | Error::BadWireFormat { .. }
            | Error::NotThisQueuePair { .. }
            | Error::LengthNotMultiple { .. }
            | Error::NotPoolSlot { .. }
            | Error::NoMatchingGid { .. }
            | Error::ForkInitTooLate { .. }
            | Error::CqResizeTooSmall { .. }
            | Error::DeviceLacks { .. }
            | Error::LibraryTooOld { .. }
            | Error::Sysfs { .. }
            | Error::GrhRequired { .. }
            | Error::MulticastMembership { .. }
            | Error::RegionInUse { .. }
            | Error::LibraryNotFound { .. } => {}
            #[cfg(feature = "rdmacm")]
            Error::UnexpectedEvent { .. } => {}
        }
    }
    all
}

/// Every message in `e`'s source chain, outermost first.
fn chain(e: &dyn std::error::Error) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push(s.to_string());
        cur = s.source();
    }
    out
}

#[test]
fn every_variant_displays_its_cause_once() {
    for e in every_variant() {
        let text = e.to_string();
        assert!(!text.trim().is_empty(), "{e:?}");
        assert!(!text.contains("{") && !text.contains('}'), "{text}");
        // No source repeats what the Display already says.
        let messages = chain(&e);
        for inner in &messages[1..] {
            assert!(!text.contains(inner.as_str()), "{text:?} repeats {inner:?}");
        }
        // The io::Error is the OS error itself, or keeps the message.
        let kind = e.io_kind();
        let verb = e.verb().is_some();
        let io: io::Error = e.into();
        assert_eq!(io.kind(), kind);
        if verb {
            assert!(text.ends_with(&io.to_string()), "{text:?}, {io}");
        } else {
            assert_eq!(io.to_string(), text);
        }
    }
}

#[test]
fn numbers_and_names_are_in_the_display() {
    let show = |e: Error| e.to_string();
    assert_eq!(
        show(Error::TooManySges { got: 5, max: 4 }),
        "5 scatter/gather entries, at most 4 allowed"
    );
    assert_eq!(
        show(Error::OutOfRange {
            what: "local PSN",
            value: 1 << 24,
            max: 0xFF_FFFF
        }),
        "local PSN 16777216 is out of range (at most 16777215)"
    );
    assert_eq!(
        show(Error::AccessNotAllowed {
            what: "a memory window",
            flags: AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        }),
        "a memory window cannot grant LOCAL_WRITE | MW_BIND"
    );
    assert_eq!(
        show(Error::SendOpFlagsRequired {
            op: SendOp::AtomicWrite,
            needed: SendOpFlags::ATOMIC_WRITE,
        }),
        "atomic write needs a queue pair created with send_ops including ATOMIC_WRITE"
    );
    assert_eq!(
        show(Error::NoDevice { name: None }),
        "no RDMA device with an active port"
    );
    assert_eq!(
        show(Error::NoDevice {
            name: Some("x".into())
        }),
        "no RDMA device named \"x\""
    );
    assert_eq!(
        show(Error::EmptyGid {
            port: PortNumber(1),
            index: GidIndex(3)
        }),
        "GID index 3 of port 1 is empty: nothing to send from"
    );
    assert_eq!(
        show(Error::NoMatchingGid {
            port: PortNumber(1),
            wanted: crate::types::GidSelector::Address("10.0.2.99".parse().unwrap()),
        }),
        "port 1 has no GID with address 10.0.2.99"
    );
    let missing = TransitionReason::Missing(rdma_verbs_sys::ibv_qp_attr_mask(
        rdma_verbs_sys::ibv_qp_attr_mask::IBV_QP_PORT.0
            | rdma_verbs_sys::ibv_qp_attr_mask::IBV_QP_QKEY.0,
    ));
    assert_eq!(
        show(Error::InvalidTransition {
            from: QpState::Reset,
            to: QpState::Init,
            reason: missing
        }),
        "illegal queue pair transition Reset -> Init: missing IBV_QP_PORT, IBV_QP_QKEY"
    );
}

#[test]
fn refused_prints_its_cause_once() {
    use crate::memory::buffer::SgList;
    use crate::qp::queue_pair::Refused;
    let verb = Error::from_errno("ibv_post_send", libc::EINVAL).with_hint(Some("the hint".into()));
    let errors = [
        verb,
        Error::TooManySges { got: 5, max: 4 },
        Error::QueueFull {
            queue: "receive queue",
            depth: 4,
        },
    ];
    for error in errors {
        let cause = error.to_string();
        let e = Refused {
            error,
            buf: SgList::Empty,
        };
        assert_eq!(e.to_string(), cause);
        let all = chain(&e).join("\n");
        assert_eq!(all.matches(cause.as_str()).count(), 1, "{all}");
        if cause.contains("Invalid argument") {
            assert_eq!(all.matches("Invalid argument").count(), 1, "{all}");
            assert_eq!(all.matches("the hint").count(), 1, "{all}");
        }
    }
}

#[test]
fn refused_converts_with_question_mark() {
    use crate::memory::buffer::SgList;
    use crate::qp::queue_pair::Refused;
    fn refused<B>(buf: B) -> std::result::Result<(), Refused<B>> {
        Err(Refused {
            error: Error::TooManySges { got: 5, max: 4 },
            buf,
        })
    }
    fn to_error() -> Result<()> {
        refused(SgList::Empty)?;
        Ok(())
    }
    fn to_io() -> io::Result<()> {
        refused(SgList::Empty)?;
        Ok(())
    }
    fn to_box() -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
        refused(SgList::Empty)?;
        Ok(())
    }
    assert!(matches!(
        to_error(),
        Err(Error::TooManySges { got: 5, max: 4 })
    ));
    let io = to_io().unwrap_err();
    assert_eq!(io.kind(), io::ErrorKind::InvalidInput);
    assert!(matches!(
        io.get_ref().and_then(|e| e.downcast_ref::<Error>()),
        Some(Error::TooManySges { got: 5, max: 4 })
    ));
    // The boxed error keeps the buffers: it is 'static (no borrowed
    // request inside).
    let boxed = to_box().unwrap_err();
    let back = boxed.downcast_ref::<Refused<SgList>>().unwrap();
    assert!(matches!(back.error, Error::TooManySges { .. }));
    // A verb error becomes its OS error, errno kept.
    let io: io::Error = Error::from_errno("ibv_post_send", libc::EINVAL)
        .with_hint(Some("why".into()))
        .into();
    assert_eq!(io.kind(), io::ErrorKind::InvalidInput);
    let io: io::Error = Error::from_errno("ibv_reg_mr", libc::ENOMEM).into();
    assert_eq!(io.raw_os_error(), Some(libc::ENOMEM));
}

#[test]
fn a_verb_newer_than_the_library_is_refused_by_release() {
    assert!(check_release("ibv_wr_flush", 45, Some(45)).is_ok());
    assert!(check_release("ibv_wr_flush", 45, Some(60)).is_ok());
    let e = check_release("ibv_wr_flush", 45, Some(44)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LibraryTooOld {
                verb: "ibv_wr_flush",
                needs: 45,
                found: Some(44)
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "ibv_wr_flush needs rdma-core 45 or newer; the loaded libibverbs is rdma-core 44"
    );
    assert_eq!(e.io_kind(), io::ErrorKind::Unsupported);
    let e = check_release("ibv_wr_flush", 45, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "ibv_wr_flush needs rdma-core 45 or newer; the loaded libibverbs is of an unknown release"
    );
}
