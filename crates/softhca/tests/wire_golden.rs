//! Golden vectors: every packet of the Linux rxe captures in
//! testdata/rxe (copied from shared/interop/rxe) parses, its ICRC verifies, and re-emitting what was
//! parsed gives the captured frame byte for byte.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use softhca::wire::icrc;
use softhca::wire::pcap::{PcapReader, LINKTYPE_ETHERNET};
use softhca::wire::roce::{self, ETHERNET_HEADER_LEN};
use softhca::wire::*;

fn rxe_dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/rxe")).to_path_buf()
}

fn frames(name: &str) -> Vec<Vec<u8>> {
    let path = rxe_dir().join(name);
    let file = File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = PcapReader::new(BufReader::new(file)).unwrap();
    assert_eq!(reader.linktype(), LINKTYPE_ETHERNET);
    reader.map(|r| r.unwrap().data).collect()
}

/// What one capture should contain, from testdata/rxe/README.md.
struct Expect {
    file: &'static str,
    packets: usize,
    opcodes: &'static [(Opcode, usize)],
}

const EXPECT: &[Expect] = &[
    Expect {
        file: "rxe-atomic_cas.pcap",
        packets: 40,
        opcodes: &[(Opcode::RcAtomicAcknowledge, 20), (Opcode::RcCompareSwap, 20)],
    },
    Expect {
        file: "rxe-atomic_faa.pcap",
        packets: 40,
        opcodes: &[(Opcode::RcAtomicAcknowledge, 20), (Opcode::RcFetchAdd, 20)],
    },
    Expect {
        file: "rxe-rc_pingpong.pcap",
        packets: 50,
        opcodes: &[
            (Opcode::RcAcknowledge, 10),
            (Opcode::RcSendFirst, 10),
            (Opcode::RcSendLast, 10),
            (Opcode::RcSendMiddle, 20),
        ],
    },
    Expect {
        file: "rxe-rc_pingpong_ipv6.pcap",
        packets: 50,
        opcodes: &[
            (Opcode::RcAcknowledge, 10),
            (Opcode::RcSendFirst, 10),
            (Opcode::RcSendLast, 10),
            (Opcode::RcSendMiddle, 20),
        ],
    },
    Expect {
        file: "rxe-rc_pingpong_loss.pcap",
        packets: 235,
        opcodes: &[
            (Opcode::RcAcknowledge, 54),
            (Opcode::RcSendFirst, 42),
            (Opcode::RcSendLast, 46),
            (Opcode::RcSendMiddle, 93),
        ],
    },
    Expect {
        file: "rxe-read_bw_4k.pcap",
        packets: 100,
        opcodes: &[
            (Opcode::RcRdmaReadRequest, 20),
            (Opcode::RcRdmaReadResponseFirst, 20),
            (Opcode::RcRdmaReadResponseLast, 20),
            (Opcode::RcRdmaReadResponseMiddle, 40),
        ],
    },
    Expect {
        file: "rxe-rping.pcap",
        packets: 41,
        opcodes: &[
            (Opcode::RcAcknowledge, 15),
            (Opcode::RcRdmaReadRequest, 3),
            (Opcode::RcRdmaReadResponseOnly, 3),
            (Opcode::RcRdmaWriteOnly, 3),
            (Opcode::RcSendOnly, 12),
            (Opcode::UdSendOnly, 5),
        ],
    },
    Expect {
        file: "rxe-send_bw_4k.pcap",
        packets: 100,
        opcodes: &[
            (Opcode::RcAcknowledge, 20),
            (Opcode::RcSendFirst, 20),
            (Opcode::RcSendLast, 20),
            (Opcode::RcSendMiddle, 40),
        ],
    },
    Expect {
        file: "rxe-send_lat_8.pcap",
        packets: 40,
        opcodes: &[(Opcode::RcAcknowledge, 20), (Opcode::RcSendOnly, 20)],
    },
    Expect {
        file: "rxe-uc_pingpong.pcap",
        packets: 40,
        opcodes: &[(Opcode::UcSendFirst, 10), (Opcode::UcSendLast, 10), (Opcode::UcSendMiddle, 20)],
    },
    Expect { file: "rxe-ud_pingpong.pcap", packets: 10, opcodes: &[(Opcode::UdSendOnly, 10)] },
    Expect {
        file: "rxe-write_bw_4k.pcap",
        packets: 100,
        opcodes: &[
            (Opcode::RcAcknowledge, 20),
            (Opcode::RcRdmaWriteFirst, 20),
            (Opcode::RcRdmaWriteLast, 20),
            (Opcode::RcRdmaWriteMiddle, 40),
        ],
    },
    Expect {
        file: "rxe-write_bw_rdmacm.pcap",
        packets: 126,
        opcodes: &[
            (Opcode::RcAcknowledge, 42),
            (Opcode::RcRdmaWriteFirst, 10),
            (Opcode::RcRdmaWriteLast, 10),
            (Opcode::RcRdmaWriteMiddle, 20),
            (Opcode::RcSendOnly, 32),
            (Opcode::UdSendOnly, 12),
        ],
    },
    Expect {
        file: "rxe-write_lat_8.pcap",
        packets: 40,
        opcodes: &[(Opcode::RcAcknowledge, 20), (Opcode::RcRdmaWriteOnly, 20)],
    },
];

/// Rule PKT-ROCE-1, PKT-ROCE-2, PKT-ROCE-7, PKT-ROCE-8, PKT-ROCE-10,
/// PKT-HDR-1, PKT-HDR-2, PKT-OP-1, PKT-OP-4, PKT-LEN-5: every rxe packet parses
/// (Ethernet, IP, UDP, BTH, extended headers), its ICRC verifies, the opcode
/// counts match the README, and re-emission reproduces each frame exactly.
#[test]
fn rxe_captures_parse_verify_and_reemit() {
    let mut total = 0;
    for e in EXPECT {
        let frames = frames(e.file);
        assert_eq!(frames.len(), e.packets, "{}", e.file);
        let mut counts: BTreeMap<u8, usize> = BTreeMap::new();
        for (i, frame) in frames.iter().enumerate() {
            let (eth, d) = roce::parse_ethernet(frame).unwrap_or_else(|err| panic!("{} #{i}: {err}", e.file));
            *counts.entry(d.packet.bth.opcode.value()).or_default() += 1;
            assert_eq!(d.packet.bth.tver, 0);
            let mut out = vec![0u8; frame.len() + 16];
            let n = d.to_repr().emit_ethernet(eth.src, eth.dst, &mut out).unwrap();
            assert_eq!(&out[..n], &frame[..], "{} #{i} re-emitted", e.file);
            total += 1;
        }
        let expected: BTreeMap<u8, usize> = e.opcodes.iter().map(|(op, n)| (op.value(), *n)).collect();
        assert_eq!(counts, expected, "{}", e.file);
    }
    assert_eq!(total, 1012);
}

/// Rule PKT-ROCE-7, PKT-ROCE-8, PKT-ROCE-10: a link that checks the ICRC while it copies a
/// datagram in (`icrc::copy_checked`, the shared-memory link's receive) copies every rxe
/// packet exactly and accepts it, and refuses it once any byte the ICRC covers is flipped,
/// as the two-pass check does, byte by byte over the headers and at spots in the payload. One
/// memo of header CRCs (`icrc::HeadMemo`) serves all of them, as a link's does: a flipped
/// header byte is never taken for the packet it was flipped from.
#[test]
fn rxe_packets_copied_with_their_icrc_checked() {
    let mut checked = 0;
    let mut memo = icrc::HeadMemo::default();
    for e in EXPECT {
        for frame in frames(e.file) {
            let d = &frame[ETHERNET_HEADER_LEN..];
            let mut out = vec![0u8; d.len()];
            // SAFETY: `d` holds `out.len()` bytes and is a different buffer.
            assert!(unsafe { icrc::copy_checked(&mut out, d.as_ptr(), &mut memo) }, "{}", e.file);
            assert_eq!(out, d);
            let spots = (0..d.len().min(80)).chain((80..d.len()).step_by(97)).chain([d.len() - 1]);
            for at in spots {
                let mut bad = d.to_vec();
                bad[at] ^= 0x10;
                // SAFETY: as above.
                let ok = unsafe { icrc::copy_checked(&mut out, bad.as_ptr(), &mut memo) };
                assert_eq!(ok, icrc::verify_datagram(&bad).is_ok(), "{} byte {at}", e.file);
                assert_eq!(out, bad);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 1012);
}

/// The parsed packets of one capture.
fn with_packets(file: &str, mut f: impl FnMut(&RoceDatagram<'_>)) {
    for frame in frames(file) {
        let (_, d) = roce::parse_ethernet(&frame).unwrap();
        f(&d);
    }
}

/// Rule PKT-ACK-1, PKT-ACK-10, PKT-ROCE-2: header fields decoded from rxe make
/// sense for the scenario: AETH on read responses except Middle, PSN Sequence
/// Error NAK syndromes in the lossy run, IPv6 headers in the IPv6 run (and rxe
/// sets AckReq on every Send Last, as we will).
#[test]
fn rxe_fields_match_scenarios() {
    let mut naks = 0;
    let mut acks = 0;
    with_packets("rxe-rc_pingpong_loss.pcap", |d| {
        if let Some(aeth) = d.packet.aeth {
            match aeth.syndrome {
                Syndrome::Nak(NakCode::PsnSeqErr) => naks += 1,
                Syndrome::Ack { .. } => acks += 1,
                other => panic!("unexpected syndrome {other:?}"),
            }
        }
        if d.packet.bth.opcode == Opcode::RcSendLast {
            assert!(d.packet.bth.ack_req);
        }
    });
    assert_eq!((acks, naks), (46, 8));

    with_packets("rxe-read_bw_4k.pcap", |d| {
        let p = &d.packet;
        match p.bth.opcode {
            Opcode::RcRdmaReadRequest => assert_eq!(p.reth.unwrap().dma_length, 4096),
            Opcode::RcRdmaReadResponseMiddle => assert!(p.aeth.is_none()),
            Opcode::RcRdmaReadResponseFirst | Opcode::RcRdmaReadResponseLast => {
                assert!(p.aeth.unwrap().syndrome.is_ack());
                assert_eq!(p.payload.len(), 1024, "PMTU 1024");
            }
            op => panic!("unexpected {op:?}"),
        }
    });

    with_packets("rxe-atomic_cas.pcap", |d| {
        let p = &d.packet;
        match p.bth.opcode {
            Opcode::RcCompareSwap => assert!(p.atomic_eth.is_some() && p.payload.is_empty()),
            Opcode::RcAtomicAcknowledge => assert!(p.atomic_ack_eth.is_some() && p.aeth.is_some()),
            op => panic!("unexpected {op:?}"),
        }
    });

    with_packets("rxe-rc_pingpong_ipv6.pcap", |d| {
        assert!(matches!(d.ip, IpRepr::V6(_)));
    });
}

/// Rule PKT-OP-1, PKT-HDR-1: the connection-manager MADs of rping
/// are UD_SEND_ONLY to QP1 with a DETH (the GSI Q_Key 0x80010000) and a
/// 256-byte MAD.
#[test]
fn rxe_rping_cm_mads_are_ud_sends_to_qp1() {
    let mut mads = 0;
    with_packets("rxe-rping.pcap", |d| {
        let p = &d.packet;
        if p.bth.opcode == Opcode::UdSendOnly {
            mads += 1;
            assert_eq!(p.bth.dest_qp, 1);
            let deth = p.deth.unwrap();
            assert_eq!(deth.q_key, 0x8001_0000);
            assert_eq!(deth.src_qp, 1);
            assert_eq!(p.payload.len(), 256);
        }
    });
    assert_eq!(mads, 5);
}
