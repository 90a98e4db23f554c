//! Cross-check with an independent decoder: a pcap holding one packet of
//! every opcode softhca knows is decoded by tshark, and every field tshark
//! reports must be the one we meant to write.
//!
//! Needs `tshark` on PATH. Without it the test fails when `CI` is set and is
//! skipped (with a message) otherwise.

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

use softhca::wire::pcap::PcapWriter;
use softhca::wire::roce::{self, UdpRepr};
use softhca::wire::*;

/// The fields asked of tshark, in this order.
const FIELDS: &[&str] = &[
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.rdeth.eecnxt",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.atomiceth",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.atomicacketh.origremdt",
    "infiniband.immdt",
    "infiniband.ieth",
];

/// AETH syndromes cycled through the packets that carry one.
const SYNDROMES: [Syndrome; 5] = [
    Syndrome::Ack { credit_code: 7 },
    Syndrome::RnrNak { timer_code: 14 },
    Syndrome::Nak(NakCode::PsnSeqErr),
    Syndrome::Nak(NakCode::RemoteAccessError),
    Syndrome::ACK_NO_CREDITS,
];

/// The packet of row `i` of the opcode table, with fields derived from `i`
/// so that every packet differs.
fn packet_for(i: usize, info: &OpcodeInfo, payload: &'static [u8]) -> PacketRepr<'static> {
    let n = i as u32;
    let mut bth = BthRepr::new(info.opcode, 0xffff - n as u16, 0x100 + n, Psn::new(0xfff_000 + n * 0x10101));
    bth.ack_req = i.is_multiple_of(2);
    bth.se = info.solicited_event && !i.is_multiple_of(3);
    let h = info.headers;
    PacketRepr {
        bth,
        rdeth: h.contains(ExtHeaders::RDETH).then_some(RdethRepr { ee_cnxt: 0x30_0000 + n }),
        deth: h.contains(ExtHeaders::DETH).then_some(DethRepr { q_key: 0x8001_0000 + n, src_qp: 0x40_0000 + n }),
        xrceth: h.contains(ExtHeaders::XRCETH).then_some(XrcEthRepr { xrc_srq: 0x50_0000 + n }),
        reth: h.contains(ExtHeaders::RETH).then_some(RethRepr {
            va: 0x1122_3344_5566_0000 + u64::from(n),
            r_key: 0xabc0_0000 + n,
            dma_length: 0x1000 + n,
        }),
        atomic_eth: h.contains(ExtHeaders::ATOMIC_ETH).then_some(AtomicEthRepr {
            va: 0x7700_0000_0000_0000 + u64::from(n) * 8,
            r_key: 0x5500_0000 + n,
            swap_add_data: 0x1111_0000 + u64::from(n),
            compare_data: 0x2222_0000 + u64::from(n),
        }),
        aeth: h
            .contains(ExtHeaders::AETH)
            .then_some(AethRepr { syndrome: SYNDROMES[i % SYNDROMES.len()], msn: 0x20_0000 + n }),
        atomic_ack_eth: h
            .contains(ExtHeaders::ATOMIC_ACK_ETH)
            .then_some(AtomicAckEthRepr { orig_remote_data: 0x3333_0000_0000 + u64::from(n) }),
        immdt: h.contains(ExtHeaders::IMMDT).then_some(ImmDtRepr { imm_data: 0xdead_0000 + n }),
        ieth: h.contains(ExtHeaders::IETH).then_some(IethRepr { r_key: 0xbeef_0000 + n }),
        payload: if info.payload { payload } else { &[] },
    }
}

fn tshark_available() -> bool {
    Command::new("tshark").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// Rule PKT-HDR-1, PKT-OP-1, PKT-OP-4, PKT-ACK-1, PKT-LEN-5, PKT-ROCE-1,
/// PKT-ROCE-2, PKT-ROCE-7, PKT-ROCE-8, PKT-ROCE-12: tshark decodes every
/// RC, UC and UD opcode and the CNP, and every header field as written.
#[test]
fn tshark_decodes_every_opcode() {
    if !tshark_available() {
        assert!(std::env::var_os("CI").is_none(), "tshark is required in CI (apt-get install tshark)");
        eprintln!("SKIPPED tshark_decodes_every_opcode: tshark not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("softhca-wire-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("every_opcode.pcap");

    // RD is left out: tshark 4.0 places the RDETH 8 bytes too late (after
    // where a DETH would be), against the BTH, RDETH, DETH order of PKT-OP-4
    // and its own dissector's stated order; XRC too: tshark has no XRC
    // dissector (no XRCETH field). Both layouts are checked by wire_headers'
    // known answers instead. And IBA 1.5's Atomic Write (0x1D), which tshark
    // 4.0 does not know (it shows no RETH): wire_headers checks its row.
    let packets: Vec<PacketRepr<'static>> = OPCODES
        .iter()
        .enumerate()
        .filter(|(_, info)| !matches!(info.service, ServiceType::Rd | ServiceType::Xrc))
        .filter(|(_, info)| info.opcode != Opcode::RcAtomicWrite)
        .map(|(i, info)| packet_for(i, info, b"payload"))
        .collect();
    assert_eq!(packets.len(), 23 + 12 + 2 + 1);
    let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    let mut frame = [0u8; 256];
    for (i, p) in packets.iter().enumerate() {
        let repr = RoceRepr {
            ip: IpRepr::V4(Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2))),
            udp: UdpRepr::for_qp(0x11, UdpChecksum::Compute),
            packet: *p,
        };
        let n = repr.emit_ethernet(roce::MAC_A, roce::MAC_B, &mut frame).unwrap();
        w.write_packet(Duration::from_micros(1_700_000_000_000_000 + i as u64), &frame[..n]).unwrap();
    }
    w.flush().unwrap();
    drop(w);

    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(&path).args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=f"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "tshark failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), packets.len(), "{text}");

    for (p, line) in packets.iter().zip(&lines) {
        let cols: Vec<&str> = line.split('|').collect();
        assert_eq!(cols.len(), FIELDS.len(), "{line}");
        let got = |name: &str| cols[FIELDS.iter().position(|f| *f == name).unwrap()];
        let num = |name: &str| -> u64 {
            let s = got(name);
            let r = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            r.unwrap_or_else(|_| panic!("{name} = {s:?} in {line}"))
        };
        let flag = |name: &str| matches!(got(name), "1" | "True");
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let name = p.bth.opcode.name();
        let ctx = format!("{name}: {line}");

        assert_eq!(num("infiniband.bth.opcode"), u64::from(p.bth.opcode.value()), "{ctx}");
        assert_eq!(num("infiniband.bth.p_key"), u64::from(p.bth.p_key), "{ctx}");
        assert_eq!(num("infiniband.bth.destqp"), u64::from(p.bth.dest_qp), "{ctx}");
        assert_eq!(num("infiniband.bth.psn"), u64::from(p.bth.psn.value()), "{ctx}");
        assert_eq!(flag("infiniband.bth.a"), p.bth.ack_req, "{ctx}");
        assert_eq!(flag("infiniband.bth.se"), p.bth.se, "{ctx}");
        assert_eq!(num("infiniband.bth.padcnt") as usize, (4 - p.payload.len() % 4) % 4, "{ctx}");
        if let Some(h) = p.rdeth {
            assert_eq!(num("infiniband.rdeth.eecnxt"), u64::from(h.ee_cnxt), "{ctx}");
        }
        if let Some(h) = p.deth {
            assert_eq!(num("infiniband.deth.q_key"), u64::from(h.q_key), "{ctx}");
            assert_eq!(num("infiniband.deth.srcqp"), u64::from(h.src_qp), "{ctx}");
        } else {
            assert_eq!(got("infiniband.deth.q_key"), "", "{ctx}");
        }
        if let Some(h) = p.reth {
            assert_eq!(num("infiniband.reth.va"), h.va, "{ctx}");
            assert_eq!(num("infiniband.reth.r_key"), u64::from(h.r_key), "{ctx}");
            assert_eq!(num("infiniband.reth.dmalen"), u64::from(h.dma_length), "{ctx}");
        } else if p.atomic_eth.is_none() {
            assert_eq!(got("infiniband.reth.va"), "", "{ctx}");
        }
        if let Some(h) = p.atomic_eth {
            // tshark files the AtomicETH's VA and R_Key under the RETH names.
            assert_eq!(num("infiniband.reth.va"), h.va, "{ctx}");
            assert_eq!(num("infiniband.reth.r_key"), u64::from(h.r_key), "{ctx}");
            let mut raw = h.va.to_be_bytes().to_vec();
            raw.extend_from_slice(&h.r_key.to_be_bytes());
            raw.extend_from_slice(&h.swap_add_data.to_be_bytes());
            raw.extend_from_slice(&h.compare_data.to_be_bytes());
            assert_eq!(got("infiniband.atomiceth"), hex(&raw), "{ctx}");
            assert_eq!(num("infiniband.atomiceth.swapdt"), h.swap_add_data, "{ctx}");
            assert_eq!(num("infiniband.atomiceth.cmpdt"), h.compare_data, "{ctx}");
        }
        if let Some(h) = p.aeth {
            assert_eq!(num("infiniband.aeth.syndrome"), u64::from(h.syndrome.to_byte()), "{ctx}");
            assert_eq!(num("infiniband.aeth.msn"), u64::from(h.msn), "{ctx}");
        } else {
            assert_eq!(got("infiniband.aeth.msn"), "", "{ctx}");
        }
        if let Some(h) = p.atomic_ack_eth {
            assert_eq!(num("infiniband.atomicacketh.origremdt"), h.orig_remote_data, "{ctx}");
        }
        match p.immdt {
            Some(h) => assert_eq!(got("infiniband.immdt"), hex(&h.imm_data.to_be_bytes()), "{ctx}"),
            None => assert_eq!(got("infiniband.immdt"), "", "{ctx}"),
        }
        match p.ieth {
            Some(h) => assert_eq!(got("infiniband.ieth"), hex(&h.r_key.to_be_bytes()), "{ctx}"),
            None => assert_eq!(got("infiniband.ieth"), "", "{ctx}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
