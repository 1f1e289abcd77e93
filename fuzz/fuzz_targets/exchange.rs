//! `rdma_verbs_runtime::exchange` against a peer whose bytes are the input (over an
//! in-memory `TimedStream`): never a panic; what it accepts is a message
//! that this side would write back byte for byte (the bytes after it left
//! unread); what it refuses is a malformed message (`BadWireFormat` of the
//! exchange or of its endpoint), never another error.
#![no_main]

use std::io::{self, Cursor, Read, Write};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rdma_verbs::{qp::QpNumber, Endpoint, Gid};
use rdma_verbs_runtime::{exchange, Error, TimedStream, MAX_PRIVATE_LEN};

/// The peer's bytes to read; what this side writes is discarded.
struct Peer<'a>(Cursor<&'a [u8]>);

impl Read for Peer<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Peer<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl TimedStream for Peer<'_> {
    fn timeouts(&self) -> io::Result<(Option<Duration>, Option<Duration>)> {
        Ok((None, None))
    }
    fn set_timeouts(&mut self, _: Option<Duration>, _: Option<Duration>) -> io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let me = Endpoint {
        qp_num: QpNumber(1),
        psn: 2,
        lid: 3,
        gid: Gid([4; 16]),
    };
    let mut peer = Peer(Cursor::new(data));
    match exchange(&mut peer, &me, b"mine", Duration::from_secs(1)) {
        Ok(p) => {
            assert!(p.private.len() <= MAX_PRIVATE_LEN);
            let used = peer.0.position() as usize;
            assert_eq!(used, 36 + p.private.len());
            assert_eq!(&data[..4], b"IBVX");
            assert_eq!(&data[5..9], &(p.private.len() as u32).to_be_bytes());
            assert_eq!(&data[9..36], &p.endpoint.to_bytes());
            assert_eq!(&data[36..used], &p.private[..]);
        }
        Err(Error::BadWireFormat {
            what: "endpoint exchange" | "Endpoint",
            ..
        }) => {}
        Err(e) => panic!("unexpected error {e:?}"),
    }
});
