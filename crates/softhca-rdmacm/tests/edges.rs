//! rdma_cm's answers through the C ABI, one process (`tests/c/cm_edges.c`): what a program
//! sees for bind errors, a port nobody listens on, a consumer's reject, accept with private
//! data both ways, a Send, and a disconnect that flushes the other side.

mod common;

use common::*;

#[test]
fn cm_edges() {
    if !ready() {
        return;
    }
    let exe = compile("cm_edges");
    let mut c = command(&exe, &[]);
    let out = finish(c.env("SOFTHCA_ADDR", "127.0.0.33").spawn().unwrap(), 60, "cm_edges");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("cm_edges: ok"), "{}:\n{text}", out.status);
}
