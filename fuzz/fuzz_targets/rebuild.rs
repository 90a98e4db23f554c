//! Fuzzes what the UDP link does with a datagram its socket hands it, from anyone: the UDP
//! payload (BTH … ICRC) and the addresses and port the socket reports, without the IP header
//! (`link::udp::verify`). Each input is a flags byte (bit 0: IPv6; bit 1: the exact policy),
//! the source and destination addresses, the source port, two Identification hints and the
//! payload. Nothing may panic (DESIGN rule 6); a header the link rebuilds must make the ICRC
//! verify over it; and the link's caches, kept from input to input as the link keeps them
//! (the Identification tables by length, the memo of header shapes), must give exactly what
//! a fresh cache gives.

#![no_main]

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use softhca::link::udp::verify::{rebuild, rebuild_with, IcrcCache, IcrcPolicy};
use softhca::wire::icrc;

thread_local! {
    static CACHE: RefCell<IcrcCache> = RefCell::new(IcrcCache::default());
}

/// The next `n` bytes of `data`, if there are that many.
fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = data.split_at_checked(n)?;
    *data = rest;
    Some(head)
}

fn addr(bytes: &[u8]) -> IpAddr {
    match bytes.len() {
        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).expect("16 bytes"))),
        _ => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).expect("4 bytes"))),
    }
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let Some(&[flags]) = take(&mut data, 1) else { return };
    let len = if flags & 1 != 0 { 16 } else { 4 };
    let policy = if flags & 2 != 0 { IcrcPolicy::Exact } else { IcrcPolicy::Solve };
    let (Some(src), Some(dst), Some(port), Some(h)) =
        (take(&mut data, len), take(&mut data, len), take(&mut data, 2), take(&mut data, 4))
    else {
        return;
    };
    let (src, dst, port) = (addr(src), addr(dst), u16::from_be_bytes([port[0], port[1]]));
    let hints = [u16::from_be_bytes([h[0], h[1]]), u16::from_be_bytes([h[2], h[3]])];
    let cached = CACHE.with(|c| rebuild_with(&mut c.borrow_mut(), src, port, dst, data, &hints, policy));
    let fresh = rebuild(src, port, dst, data, &hints, policy);
    match (&cached, &fresh) {
        (Ok(a), Ok(b)) => {
            assert_eq!((a.header(), a.how), (b.header(), b.how), "the cache changed the header");
            let mut datagram = a.header().to_vec();
            datagram.extend_from_slice(data);
            icrc::verify_datagram(&datagram).expect("a rebuilt header makes the ICRC verify");
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "the cache changed the refusal"),
        _ => panic!("the cache changed the answer: {cached:?} against {fresh:?}"),
    }
});
