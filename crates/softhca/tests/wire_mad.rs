//! Management datagrams and CM messages against Linux's: every MAD to QP1 in the rxe captures
//! (rdma_cm's exchanges of rping and `ib_write_bw -R`) parses as a CM message and re-emits
//! byte for byte, and the fields of rping's REQ read as tshark and the capture's own QPs say.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use softhca::wire::mad::*;
use softhca::wire::pcap::PcapReader;
use softhca::wire::roce;

/// The MADs sent to QP1 in a capture of testdata/rxe, in order.
fn mads(name: &str) -> Vec<Vec<u8>> {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/rxe")).join(name);
    let reader = PcapReader::new(BufReader::new(File::open(&path).unwrap())).unwrap();
    reader
        .map(|r| r.unwrap().data)
        .filter_map(|frame| {
            let (_, d) = roce::parse_ethernet(&frame).ok()?;
            (d.packet.bth.dest_qp == 1).then(|| d.packet.payload.to_vec())
        })
        .collect()
}

fn kinds(mads: &[Vec<u8>]) -> Vec<u16> {
    mads.iter().map(|m| CmMessage::parse(m).unwrap().1.attribute_id()).collect()
}

#[test]
fn rdma_cm_exchanges_of_linux_parse_and_reemit_byte_for_byte() {
    let rping = mads("rxe-rping.pcap");
    // REQ, REP, RTU to connect; DREQ, DREP to disconnect.
    assert_eq!(kinds(&rping), [0x10, 0x13, 0x14, 0x15, 0x16]);
    let write_bw = mads("rxe-write_bw_rdmacm.pcap");
    assert!(kinds(&write_bw).starts_with(&[0x10, 0x13, 0x14]), "{:x?}", kinds(&write_bw));
    for mad in rping.iter().chain(&write_bw) {
        assert_eq!(mad.len(), MAD_LEN);
        let (h, m) = CmMessage::parse(mad).unwrap();
        assert_eq!((h.base_version, h.mgmt_class, h.class_version, h.method), (1, MGMT_CLASS_CM, 2, METHOD_SEND));
        let mut out = [0xA5u8; MAD_LEN];
        m.emit(&h, &mut out).unwrap();
        assert_eq!(&out[..], &mad[..], "{m:?} re-emitted");
    }
}

/// rping's REQ, field by field (tshark's CM dissector reads the same values), and the REP and
/// RTU that answer it name the same communication.
#[test]
fn the_fields_of_rpings_connection() {
    let rping = mads("rxe-rping.pcap");
    let (h, CmMessage::Req(req)) = CmMessage::parse(&rping[0]).unwrap() else { panic!("not a REQ") };
    assert_eq!(h.transaction_id, 0x0000_0002_cceb_0662);
    assert_eq!(req.local_comm_id, 0x6206_ebcc);
    // rdma_cm's RDMA_PS_TCP service ID: 0x0000000001 . protocol 0x06 . port 0x1c06 (7174).
    assert_eq!(req.service_id, 0x0000_0000_0106_1c06);
    assert_eq!(req.local_ca_guid, 0x0000_00ff_fe00_0001);
    assert_eq!((req.local_qpn, req.starting_psn), (0x1e, 0xe4_563a));
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!((req.transport_service_type, req.end_to_end_flow_control), (0, 0));
    assert_eq!((req.remote_cm_response_timeout, req.local_cm_response_timeout), (20, 20));
    assert_eq!((req.retry_count, req.rnr_retry_count, req.max_cm_retries), (7, 7, 15));
    assert_eq!((req.partition_key, req.path_mtu, req.srq), (0xffff, 3, 0));
    assert_eq!((req.primary_local_lid, req.primary_remote_lid), (0xffff, 0xffff));
    let v4 = |a: [u8; 4]| [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3]];
    assert_eq!(req.primary_local_gid, v4([198, 18, 0, 1]));
    assert_eq!(req.primary_remote_gid, v4([198, 18, 0, 2]));
    assert_eq!((req.primary_hop_limit, req.primary_traffic_class, req.primary_local_ack_timeout), (0x40, 0, 0x13));
    assert_eq!(req.alternate_local_gid, [0; 16]);
    // rdma_cm's IP header in the private data: from 198.18.0.1 (its port) to 198.18.0.2.
    let cma = CmaHeader::parse(&req.private_data).unwrap();
    assert_eq!((cma.src, cma.dst), ("198.18.0.1".parse().unwrap(), "198.18.0.2".parse().unwrap()));
    assert_eq!(cma.src_port, 0xd3cb);
    let mut again = [0u8; CmaHeader::LEN];
    cma.emit(&mut again).unwrap();
    assert_eq!(again, req.private_data[..CmaHeader::LEN]);
    let v6 = CmaHeader { src_port: 1, src: "fe80::1".parse().unwrap(), dst: "fe80::2".parse().unwrap() };
    v6.emit(&mut again).unwrap();
    assert_eq!(CmaHeader::parse(&again), Some(v6));

    let (h2, CmMessage::Rep(rep)) = CmMessage::parse(&rping[1]).unwrap() else { panic!("not a REP") };
    assert_eq!(h2.transaction_id, h.transaction_id, "a REP answers in the REQ's transaction");
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    let (_, CmMessage::Rtu(rtu)) = CmMessage::parse(&rping[2]).unwrap() else { panic!("not an RTU") };
    assert_eq!((rtu.local_comm_id, rtu.remote_comm_id), (req.local_comm_id, rep.local_comm_id));
    let (_, CmMessage::Dreq(dreq)) = CmMessage::parse(&rping[3]).unwrap() else { panic!("not a DREQ") };
    assert!(dreq.remote_qpn_eecn == req.local_qpn || dreq.remote_qpn_eecn == rep.local_qpn);
}

/// Built from fields, each message parses back to itself.
#[test]
fn every_message_round_trips() {
    let h = MadHeaderRepr::cm(0, 0x1234_5678_9abc_def0);
    let mut req =
        CmReq { local_qpn: 0xAB_CDEF, starting_psn: 0x12_3456, primary_flow_label: 0xF_FFFF, ..Default::default() };
    req.private_data[..4].copy_from_slice(b"cma!");
    let msgs = [
        CmMessage::Req(Box::new(req)),
        CmMessage::Mra(Box::new(CmMra { message_mraed: 1, service_timeout: 31, ..Default::default() })),
        CmMessage::Rej(Box::new(CmRej { reason: 28, rejected_info_length: 72, ..Default::default() })),
        CmMessage::Rep(Box::new(CmRep { rnr_retry_count: 7, srq: 1, local_ca_guid: u64::MAX, ..Default::default() })),
        CmMessage::Rtu(Box::new(CmRtu { local_comm_id: 1, remote_comm_id: 2, ..Default::default() })),
        CmMessage::Dreq(Box::new(CmDreq { remote_qpn_eecn: 0xFF_FFFF, ..Default::default() })),
        CmMessage::Drep(Box::default()),
        CmMessage::SidrReq(Box::new(CmSidrReq { partition_key: 0x8001, service_id: 7, ..Default::default() })),
        CmMessage::SidrRep(Box::new(CmSidrRep { qpn: 0x12, qkey: 0x8001_0000, ..Default::default() })),
    ];
    for m in msgs {
        let mut mad = [0u8; MAD_LEN];
        m.emit(&h, &mut mad).unwrap();
        let (h2, back) = CmMessage::parse(&mad).unwrap();
        assert_eq!((h2.transaction_id, h2.attribute_id), (h.transaction_id, m.attribute_id()));
        assert_eq!(back, m);
    }
}
