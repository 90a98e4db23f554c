//! `softhca devinfo`: the device, its port and GID table, and its attributes, in
//! `ibv_devinfo`'s layout.

use softhca::*;

use crate::net::{self, LinkKind, Net, Res};
use crate::PcapArg;

#[derive(clap::Args, Debug)]
pub struct DevinfoArgs {
    /// Show every device attribute, not only the main limits.
    #[arg(short, long)]
    pub verbose: bool,
    /// Which link the device sits on: `sim` (the simulated fabric, GID ::ffff:127.1.0.1) or
    /// `udp` (a real device on UDP port 4791 of SOFTHCA_ADDR or the first free 127.0.0.x).
    #[arg(long, value_enum, default_value_t = LinkKind::Sim)]
    pub link: LinkKind,
    /// The device's name (its hca_id).
    #[arg(long, short = 'd', default_value = "softhca0", value_name = "NAME")]
    pub device: String,
    #[command(flatten)]
    pub pcap: PcapArg,
}

pub fn run(args: &DevinfoArgs) -> Res<()> {
    match args.link {
        LinkKind::Sim => {
            let mut net = Net::sim(&net::Faults::default(), args.pcap.pcap.as_deref())?;
            let ctx = net.add_device(&args.device)?;
            print!("{}", render(&ctx, args.verbose, "sim (in-process simulated fabric)")?);
            net.finish()
        }
        LinkKind::Shm => {
            let mut net = Net::os(LinkKind::Shm, args.pcap.pcap.as_deref(), false);
            let ctx = net.add_device(&args.device)?;
            let link = match net.os_devices().first() {
                Some(net::OsDevice::Shm(d)) => format!("shm {} (rings in /dev/shm)", d.addr()),
                _ => "shm".to_string(),
            };
            print!("{}", render(&ctx, args.verbose, &link)?);
            net.finish()
        }
        LinkKind::Udp => {
            let mut net = Net::udp(args.pcap.pcap.as_deref(), false);
            let ctx = net.add_device(&args.device)?;
            let link = net
                .os_devices()
                .first()
                .and_then(|d| match d {
                    net::OsDevice::Udp(d) => Some(d),
                    net::OsDevice::Shm(_) => None,
                })
                .map(|d| {
                    let (gso, gro) = d.offloads();
                    format!(
                        "udp {}:4791 (IPv4 ICRC on receive: {}; GSO {}, GRO {})",
                        d.addr(),
                        if d.raw_rx() { "exact, raw socket" } else { "UDP socket" },
                        if gso { "on" } else { "off" },
                        if gro { "on" } else { "off" }
                    )
                })
                .unwrap_or_else(|| "udp".into());
            print!("{}", render(&ctx, args.verbose, &link)?);
            net.finish()
        }
    }
}

fn guid(g: u64) -> String {
    format!("{:04x}:{:04x}:{:04x}:{:04x}", g >> 48, (g >> 32) & 0xffff, (g >> 16) & 0xffff, g & 0xffff)
}

fn mtu(m: Mtu) -> String {
    format!("{} ({})", m.bytes(), m as u32)
}

/// The devinfo text of `ctx`.
pub fn render(ctx: &Context, verbose: bool, link: &str) -> Res<String> {
    use std::fmt::Write;
    let a = ctx.query_device()?;
    let p = ctx.query_port(1)?;
    let mut s = String::new();
    let kv = |s: &mut String, indent: usize, k: &str, v: String| {
        let _ = writeln!(s, "{:indent$}{:<32}{v}", "", format!("{k}:"), indent = indent);
    };
    let _ = writeln!(s, "hca_id:\t{}", ctx.name());
    kv(&mut s, 8, "transport", "InfiniBand (0)".into());
    kv(&mut s, 8, "link", link.into());
    kv(&mut s, 8, "fw_ver", a.fw_ver.clone());
    kv(&mut s, 8, "node_guid", guid(a.node_guid));
    kv(&mut s, 8, "sys_image_guid", guid(a.sys_image_guid));
    kv(&mut s, 8, "vendor_id", format!("{:#06x}", a.vendor_id));
    kv(&mut s, 8, "vendor_part_id", a.vendor_part_id.to_string());
    kv(&mut s, 8, "hw_ver", format!("{:#x}", a.hw_ver));
    kv(&mut s, 8, "phys_port_cnt", a.phys_port_cnt.to_string());
    let mut attrs: Vec<(&str, String)> = vec![
        ("max_mr_size", format!("{:#x}", a.max_mr_size)),
        ("page_size_cap", format!("{:#x}", a.page_size_cap)),
        ("max_qp", a.max_qp.to_string()),
        ("max_qp_wr", a.max_qp_wr.to_string()),
        ("max_sge", a.max_sge.to_string()),
        ("max_cq", a.max_cq.to_string()),
        ("max_cqe", a.max_cqe.to_string()),
        ("max_mr", a.max_mr.to_string()),
        ("max_pd", a.max_pd.to_string()),
        ("max_qp_rd_atom", a.max_qp_rd_atom.to_string()),
        ("max_qp_init_rd_atom", a.max_qp_init_rd_atom.to_string()),
        ("atomic_cap", format!("{:?}", a.atomic_cap).to_uppercase().replace("GLOB", "ATOMIC_GLOB (2)")),
        ("max_inline_data", a.max_inline_data.to_string()),
        ("max_ah", a.max_ah.to_string()),
    ];
    if verbose {
        attrs.extend([
            ("max_sge_rd", a.max_sge_rd.to_string()),
            ("max_res_rd_atom", a.max_res_rd_atom.to_string()),
            ("max_srq", a.max_srq.to_string()),
            ("max_srq_wr", a.max_srq_wr.to_string()),
            ("max_mw", a.max_mw.to_string()),
            ("max_ee", a.max_ee.to_string()),
            ("max_rdd", a.max_rdd.to_string()),
            ("max_pkeys", a.max_pkeys.to_string()),
            ("resize_cq", a.resize_cq.to_string()),
            ("resize_wq", a.resize_wq.to_string()),
            ("auto_path_mig", a.auto_path_mig.to_string()),
            ("port_change", a.port_change.to_string()),
        ]);
    }
    for (k, v) in attrs {
        kv(&mut s, 8, k, v);
    }
    let _ = writeln!(s, "\t\tport:\t1");
    let state = match p.state {
        PortState::Down => "PORT_DOWN (1)",
        PortState::Init => "PORT_INIT (2)",
        PortState::Armed => "PORT_ARMED (3)",
        PortState::Active => "PORT_ACTIVE (4)",
    };
    kv(&mut s, 24, "state", state.into());
    kv(&mut s, 24, "max_mtu", mtu(p.max_mtu));
    kv(&mut s, 24, "active_mtu", mtu(p.active_mtu));
    kv(&mut s, 24, "sm_lid", p.sm_lid.to_string());
    kv(&mut s, 24, "port_lid", p.lid.to_string());
    kv(&mut s, 24, "port_lmc", format!("{:#04x}", p.lmc));
    kv(&mut s, 24, "link_layer", if p.link_layer_ethernet { "Ethernet" } else { "InfiniBand" }.into());
    if verbose {
        kv(&mut s, 24, "max_msg_sz", format!("{:#x}", p.max_msg_sz));
        kv(&mut s, 24, "gid_tbl_len", p.gid_tbl_len.to_string());
        kv(&mut s, 24, "pkey_tbl_len", p.pkey_tbl_len.to_string());
        kv(&mut s, 24, "active_speed", format!("{} Gb/s", p.active_speed_gbps));
        for i in 0..p.pkey_tbl_len {
            kv(&mut s, 24, &format!("P_Key[{i:>3}]"), format!("{:#06x}", ctx.query_pkey(1, i)?));
        }
    }
    for i in 0..p.gid_tbl_len {
        let g = ctx.query_gid(1, i)?;
        if g.is_zero() {
            continue; // an empty slot, as ibv_devinfo leaves them out
        }
        kv(&mut s, 24, &format!("GID[{i:>3}]"), format!("{}, RoCE v2 ({})", g, net::display_gid(g)));
    }
    Ok(s)
}
