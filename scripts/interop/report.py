#!/usr/bin/env python3
"""One line per interop case: PASS, FAIL or KNOWN (a failure listed in known-failures).

Usage: report.py GUEST_OUT --icrc ICRC.md [--known FILE] [--md RESULTS.md]
       report.py --speed SPEED_DIR      (guest.sh --speed: the perftest figures and ratios)

GUEST_OUT is what scripts/interop/guest.sh left ($OUT): cases/NAME/{cmd,rc}.txt and the
server and client logs, pcap/NAME.pcap. ICRC.md is the markdown table that
../shared/tools/rxe-vm/verify_pcaps.py --md printed for those pcaps (ICRC recomputed for every
RoCEv2 packet, opcodes, AETH kinds). This script reads the pcaps itself only to count packets
per sender and to find frames longer than the veth MTU (a GSO superpacket that was not split).
A case passes when both programs exit 0 (and rdma_check says VERDICT PASS on both sides),
its capture holds RoCEv2 packets from both ends, and every ICRC verifies.
Exit status: 0 if every case passed or is a known failure, else 1.
"""
import glob
import math
import os
import re
import statistics
import struct
import sys

RXE_IP, SHCA_IP = "198.18.0.1", "198.18.0.2"
MAX_FRAME = 14 + 9000


def read_kv(path):
    kv = {}
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                kv[k] = v
    return kv


def pcap_stats(path):
    """packets per source address and the number of frames over MAX_FRAME"""
    per_src, big = {}, 0
    with open(path, "rb") as f:
        hdr = f.read(24)
        if len(hdr) < 24:
            return per_src, big
        endian = "<" if hdr[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                break
            _, _, caplen, wirelen = struct.unpack(endian + "IIII", rec)
            data = f.read(caplen)
            if wirelen > MAX_FRAME:
                big += 1
            if len(data) >= 34 and data[12:14] == b"\x08\x00":
                src = ".".join(str(b) for b in data[26:30])
                per_src[src] = per_src.get(src, 0) + 1
    return per_src, big


def read_icrc(path):
    rows = {}
    for line in open(path, errors="replace"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 8 or not cells[0].endswith(".pcap"):
            continue
        ok, bad = (int(x) for x in cells[3].split("/"))
        rows[cells[0][:-5]] = dict(roce=int(cells[2]), ok=ok, bad=bad, tshark=cells[4],
                                   ops=cells[5], aeth=cells[6], resent=int(cells[7]))
    return rows


def read_known(path):
    known = []
    if path and os.path.exists(path):
        for line in open(path):
            line = line.rstrip("\n")
            if line and not line.startswith("#") and "\t" in line:
                pat, why = line.split("\t", 1)
                known.append((re.compile(pat), why))
    return known


def log_reason(text):
    """the line of a log that says best what went wrong"""
    for pat in (r"VERDICT FAIL.*", r".*(?:[Ee]rror|[Ff]ailed|Couldn't|[Uu]nable|not found).*"):
        m = re.findall(pat, text)
        if m:
            return m[0].strip()[:150]
    return ""


def judge(gdir, name, icrc):
    d = os.path.join(gdir, "cases", name)
    rc = read_kv(os.path.join(d, "rc.txt"))
    logs = {}
    for side in ("server", "client"):
        p = os.path.join(d, side + ".log")
        logs[side] = open(p, errors="replace").read() if os.path.exists(p) else ""
    cmd = open(os.path.join(d, "cmd.txt")).read() if os.path.exists(os.path.join(d, "cmd.txt")) else ""
    reasons = []
    for side in ("server", "client"):
        r = rc.get(side + "_rc", "?")
        if r == "124":
            reasons.append("%s timed out" % side)
        elif r != "0":
            why = log_reason(logs[side])
            reasons.append("%s rc=%s%s" % (side, r, (": " + why) if why else ""))
    if "rdma_check" in cmd:
        for side in ("server", "client"):
            if "VERDICT PASS" not in logs[side] and not any(x.startswith(side) for x in reasons):
                reasons.append("%s: %s" % (side, log_reason(logs[side]) or "no verdict"))
    pcap = os.path.join(gdir, "pcap", name + ".pcap")
    per_src, big = pcap_stats(pcap) if os.path.exists(pcap) else ({}, 0)
    ic = icrc.get(name)
    if ic is None:
        reasons.append("no ICRC check (pcap missing?)")
    else:
        if ic["bad"]:
            reasons.append("ICRC bad in %d of %d packets" % (ic["bad"], ic["roce"]))
        # Multicast (mckey) is one way: only the client, the sender, puts packets on the wire.
        one_way = ".mckey." in name
        sender = RXE_IP if name.endswith(".shca-srv") else SHCA_IP
        needed = (sender,) if one_way else (RXE_IP, SHCA_IP)
        if not all(per_src.get(ip) for ip in needed):
            reasons.append("capture lacks %s (rxe %d, softhca %d packets)"
                           % ("the sender" if one_way else "one end",
                              per_src.get(RXE_IP, 0), per_src.get(SHCA_IP, 0)))
    if big:
        reasons.append("%d frames over the veth MTU (unsplit GSO)" % big)
    if rc.get("capture_dropped") not in (None, "", "0"):
        reasons.append("capture incomplete: tcpdump dropped %s packets" % rc["capture_dropped"])
    if rc.get("capture_truncated") == "1":
        reasons.append("capture truncated (retransmission storm?)")
    results = " ".join(re.sub(r"^RESULT ", "", l) for l in (logs["server"] + logs["client"]).splitlines()
                       if l.startswith("RESULT ") and "local_qpn" not in l)
    return dict(name=name, ok=not reasons, reasons=reasons, secs=rc.get("seconds", "?"),
                drops=int(rc.get("softhca_udp_drops", "0") or 0),
                rxe=per_src.get(RXE_IP, 0), shca=per_src.get(SHCA_IP, 0),
                icrc=ic, results=results, srv=rc.get("server_side", "?"),
                attempts=int(rc.get("attempts", "1") or 1))


def perftest_row(path, header, index):
    """field `index` of perftest's result row, the line after the header line containing
    `header` (headers have spaces inside column names, so fields are taken by position)"""
    if not os.path.exists(path):
        return None
    lines = open(path, errors="replace").read().splitlines()
    for i, l in enumerate(lines):
        if header in l and i + 1 < len(lines):
            vals = lines[i + 1].split()
            if len(vals) > index:
                try:
                    v, iters = float(vals[index]), float(vals[1])
                except ValueError:
                    return None
                # perftest prints inf (and 0.00 bandwidth) when its cycle-counter calibration
                # fails, as it sometimes does on the guest's emulated vCPUs: no figure. So is a
                # bandwidth of 0.00 after a run whose iteration count is like the others' (seen
                # 3 times in 20 UDP runs on 2026-11-29: its time, not its traffic, went wrong).
                if not math.isfinite(v) or (header.startswith("BW") and v == 0.0 and iters > 0):
                    return None
                return v
    return None


def perftest_runs(sdir, who, test):
    """`who`'s figure of `test` (write_bw: BW average, send_lat: t_typical) in every run of the
    boot, in run order: guest.sh --speed runs each case several times, the rounds interleaved
    (logs `WHO.TEST.N.client.log`; a single run's `WHO.TEST.client.log` is read too)"""
    # #bytes #iterations BW-peak BW-average MsgRate / #bytes #iterations t_min t_max t_typical
    header, index = ("BW average[MB/sec]", 3) if test == "write_bw" else ("t_typical[usec]", 4)
    numbered = []
    for path in glob.glob(os.path.join(sdir, "%s.%s.*.client.log" % (who, test))):
        n = path[len(os.path.join(sdir, "%s.%s." % (who, test))):-len(".client.log")]
        if n.isdigit():
            numbered.append((int(n), path))
    paths = [os.path.join(sdir, "%s.%s.client.log" % (who, test))] + [p for _, p in sorted(numbered)]
    return [v for v in (perftest_row(p, header, index) for p in paths) if v is not None]


def median(vals):
    return statistics.median(vals) if vals else None


def speed(sdir):
    bw, lat = {}, {}
    whos = ("rxe", "softhca.busy0", "softhca.busy1", "softhca.shm.busy0", "softhca.shm.busy1")
    for who in whos:
        bw[who] = median(perftest_runs(sdir, who, "write_bw"))
        lat[who] = median(perftest_runs(sdir, who, "send_lat"))
    names = {"rxe": "rxe0 -> rxe1 (veth)", "softhca.busy0": "softhca -> softhca (blocking)",
             "softhca.busy1": "softhca -> softhca (busy-poll)", "softhca.shm.busy0": "softhca shm (blocking)",
             "softhca.shm.busy1": "softhca shm (busy-poll)"}
    print("same guest, emulated, the median of each case's runs (ratios: softhca / rxe; higher is "
          "better for bandwidth, lower for latency)")
    print("%-32s %22s %22s" % ("", "ib_write_bw 64 KiB", "ib_send_lat 8 B typ."))
    for who in whos:
        b = "%.1f MiB/s" % bw[who] if bw[who] is not None else "-"
        t = "%.2f us" % lat[who] if lat[who] is not None else "-"
        if who != "rxe" and bw[who] and bw["rxe"]:
            b += " (%.2fx)" % (bw[who] / bw["rxe"])
        if who != "rxe" and lat[who] and lat["rxe"]:
            t += " (%.2fx)" % (lat[who] / lat["rxe"])
        print("%-32s %22s %22s" % (names[who], b, t))
    return 0 if all(v is not None for v in list(bw.values()) + list(lat.values())) else 1


def main(argv):
    if argv and argv[0] == "--speed":
        return speed(argv[1])
    gdir = argv[0]
    opts = dict(zip(argv[1::2], argv[2::2]))
    icrc = read_icrc(opts["--icrc"]) if "--icrc" in opts else {}
    known = read_known(opts.get("--known"))
    names = sorted(os.listdir(os.path.join(gdir, "cases"))) if os.path.isdir(os.path.join(gdir, "cases")) else []
    # keep the guest's order: the directories' creation order
    names.sort(key=lambda n: os.stat(os.path.join(gdir, "cases", n)).st_mtime)
    rows, failed = [], 0
    for n in names:
        r = judge(gdir, n, icrc)
        r["verdict"] = "PASS"
        if not r["ok"]:
            why = next((w for pat, w in known if pat.search(n)), None)
            r["verdict"] = "KNOWN" if why else "FAIL"
            r["known"] = why
            failed += why is None
        rows.append(r)
        ic = r["icrc"]
        icrc_s = "ICRC %d/%d ok" % (ic["ok"], ic["roce"]) if ic else "ICRC -"
        aeth = (" [%s]" % ic["aeth"]) if ic and ic["aeth"] not in ("-", "") and (
            "NAK" in ic["aeth"] or not r["ok"]) else ""
        drops = (" softhca-rcvbuf-drops %d" % r["drops"]) if r["drops"] else ""
        again = (" (attempt %d)" % r["attempts"]) if r["attempts"] > 1 else ""
        line = "%-5s %-34s %6ss  rxe %5d / softhca %5d pkts  %s%s%s%s" % (
            r["verdict"], n, r["secs"], r["rxe"], r["shca"], icrc_s, aeth, drops, again)
        if not r["ok"]:
            line += "  -- " + "; ".join(r["reasons"])
            if r.get("known"):
                line += "  (known: %s)" % r["known"]
        print(line)
    npass = sum(r["verdict"] == "PASS" for r in rows)
    nknown = sum(r["verdict"] == "KNOWN" for r in rows)
    print("rxe-interop: %d cases, %d pass, %d known failures, %d fail" % (len(rows), npass, nknown, failed))
    if "--md" in opts:
        with open(opts["--md"], "w") as f:
            f.write("| case | server | result | s | packets rxe / softhca | ICRC ok | AETH | softhca rcvbuf drops | notes |\n")
            f.write("|---|---|---|---|---|---|---|---|---|\n")
            for r in rows:
                ic = r["icrc"]
                note = "; ".join(r["reasons"]) if not r["ok"] else r["results"]
                if r["attempts"] > 1:
                    note = ("attempt %d; " % r["attempts"]) + note
                f.write("| %s | %s | %s | %s | %d / %d | %s | %s | %d | %s |\n" % (
                    r["name"].rsplit(".", 1)[0], "rxe" if r["srv"] == "rxe" else "softhca",
                    r["verdict"], r["secs"], r["rxe"], r["shca"],
                    "%d/%d" % (ic["ok"], ic["roce"]) if ic else "-", ic["aeth"] if ic else "-",
                    r["drops"], note.replace("|", "/")))
    if "--pairs" in opts:
        write_pairs(opts["--pairs"], rows)
    return 1 if failed or not rows else 0


def write_pairs(path, rows):
    """The README's table: one line per case, rxe as server beside softhca as server."""
    def cell(r):
        ic = r["icrc"]
        parts = ["%s %ss, %d/%d pkts" % (r["verdict"], r["secs"], r["rxe"], r["shca"])]
        if ic and ic["aeth"] not in ("-", "") and ("NAK" in ic["aeth"] or not r["ok"]):
            parts.append(ic["aeth"])
        if r["drops"]:
            parts.append("%d drops" % r["drops"])
        again = " (attempt %d)" % r["attempts"] if r["attempts"] > 1 else ""
        return ", ".join(parts) + again
    cases = {}
    for r in rows:
        cases.setdefault(r["name"].rsplit(".", 1)[0], {})[r["srv"]] = r
    with open(path, "w") as f:
        f.write("| case | rxe server, softhca client | softhca server, rxe client | ICRC checked (both) |\n")
        f.write("|---|---|---|---|\n")
        for case, by in cases.items():
            ends = [by.get("rxe"), next((v for k, v in by.items() if k != "rxe"), None)]
            ok = sum(r["icrc"]["ok"] for r in ends if r and r["icrc"])
            total = sum(r["icrc"]["roce"] for r in ends if r and r["icrc"])
            f.write("| %s | %s | %s | %d/%d |\n" % (
                case, *(cell(r) if r else "-" for r in ends), ok, total))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
