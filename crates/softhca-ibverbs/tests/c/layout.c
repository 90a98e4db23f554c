/* Prints the sizes and field offsets of the libibverbs structures softhca-ibverbs mirrors, in
   the format of softhca_ibverbs::abi::layout_report(), from the system's infiniband/verbs.h. */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define SIZE(t) printf(#t " %zu\n", sizeof(struct t))
#define OFF(t, f) printf(#t "." #f " %zu\n", offsetof(struct t, f))

int main(void)
{
	SIZE(ibv_device); SIZE(ibv_context_ops); SIZE(ibv_device_attr); printf("ibv_gid %zu\n", sizeof(union ibv_gid));
	SIZE(ibv_pd); SIZE(ibv_mr); SIZE(ibv_comp_channel); SIZE(ibv_cq); SIZE(ibv_srq);
	SIZE(ibv_mw); SIZE(ibv_mw_bind_info); SIZE(ibv_mw_bind);
	SIZE(ibv_qp); SIZE(ibv_ah); SIZE(ibv_wc); SIZE(ibv_sge); SIZE(ibv_send_wr); SIZE(ibv_recv_wr);
	SIZE(ibv_qp_cap); SIZE(ibv_qp_init_attr);
	SIZE(ibv_global_route); SIZE(ibv_ah_attr); SIZE(ibv_qp_attr); SIZE(ibv_srq_attr); SIZE(ibv_srq_init_attr);
	SIZE(ibv_async_event);
	OFF(ibv_device, node_type); OFF(ibv_device, name); OFF(ibv_device, dev_name); OFF(ibv_device, dev_path);
	OFF(ibv_device, ibdev_path);
	OFF(ibv_context_ops, poll_cq); OFF(ibv_context_ops, req_notify_cq); OFF(ibv_context_ops, post_srq_recv);
	OFF(ibv_context_ops, post_send); OFF(ibv_context_ops, post_recv); OFF(ibv_context_ops, _compat_async_event);
	OFF(ibv_context, ops); OFF(ibv_context, cmd_fd); OFF(ibv_context, async_fd); OFF(ibv_context, num_comp_vectors);
	OFF(ibv_context, mutex); OFF(ibv_context, abi_compat);
	OFF(ibv_device_attr, node_guid); OFF(ibv_device_attr, max_qp); OFF(ibv_device_attr, device_cap_flags);
	OFF(ibv_device_attr, atomic_cap); OFF(ibv_device_attr, max_srq_sge); OFF(ibv_device_attr, max_pkeys);
	OFF(ibv_device_attr, phys_port_cnt);
	OFF(ibv_port_attr, state); OFF(ibv_port_attr, active_mtu); OFF(ibv_port_attr, gid_tbl_len);
	OFF(ibv_port_attr, max_msg_sz); OFF(ibv_port_attr, pkey_tbl_len); OFF(ibv_port_attr, lid); OFF(ibv_port_attr, lmc);
	OFF(ibv_port_attr, active_width); OFF(ibv_port_attr, link_layer);
	OFF(ibv_mr, addr); OFF(ibv_mr, length); OFF(ibv_mr, handle); OFF(ibv_mr, lkey); OFF(ibv_mr, rkey);
	OFF(ibv_comp_channel, fd); OFF(ibv_comp_channel, refcnt);
	OFF(ibv_mw, pd); OFF(ibv_mw, rkey); OFF(ibv_mw, handle); printf("ibv_mw.mw_type %zu\n", offsetof(struct ibv_mw, type));
	OFF(ibv_mw_bind_info, addr); OFF(ibv_mw_bind_info, length); OFF(ibv_mw_bind_info, mw_access_flags);
	OFF(ibv_mw_bind, send_flags); OFF(ibv_mw_bind, bind_info);
	OFF(ibv_context_ops, alloc_mw); OFF(ibv_context_ops, bind_mw); OFF(ibv_context_ops, dealloc_mw);
	OFF(ibv_cq, channel); OFF(ibv_cq, cq_context); OFF(ibv_cq, handle); OFF(ibv_cq, cqe); OFF(ibv_cq, mutex);
	OFF(ibv_cq, cond); OFF(ibv_cq, comp_events_completed); OFF(ibv_cq, async_events_completed);
	OFF(ibv_srq, srq_context); OFF(ibv_srq, pd); OFF(ibv_srq, handle); OFF(ibv_srq, mutex); OFF(ibv_srq, cond);
	OFF(ibv_srq, events_completed);
	OFF(ibv_qp, qp_context); OFF(ibv_qp, pd); OFF(ibv_qp, send_cq); OFF(ibv_qp, recv_cq); OFF(ibv_qp, srq);
	OFF(ibv_qp, handle); OFF(ibv_qp, qp_num); OFF(ibv_qp, state); OFF(ibv_qp, qp_type); OFF(ibv_qp, mutex);
	OFF(ibv_qp, cond); OFF(ibv_qp, events_completed);
	OFF(ibv_ah, pd); OFF(ibv_ah, handle);
	OFF(ibv_wc, status); OFF(ibv_wc, opcode); OFF(ibv_wc, vendor_err); OFF(ibv_wc, byte_len); OFF(ibv_wc, imm_data);
	OFF(ibv_wc, qp_num); OFF(ibv_wc, src_qp); OFF(ibv_wc, wc_flags); OFF(ibv_wc, pkey_index); OFF(ibv_wc, slid);
	OFF(ibv_wc, sl); OFF(ibv_wc, dlid_path_bits);
	OFF(ibv_send_wr, next); OFF(ibv_send_wr, sg_list); OFF(ibv_send_wr, num_sge); OFF(ibv_send_wr, opcode);
	OFF(ibv_send_wr, send_flags); OFF(ibv_send_wr, imm_data); OFF(ibv_send_wr, wr); OFF(ibv_send_wr, qp_type);
	OFF(ibv_send_wr, bind_mw);
	OFF(ibv_recv_wr, next); OFF(ibv_recv_wr, sg_list); OFF(ibv_recv_wr, num_sge);
	OFF(ibv_qp_init_attr, send_cq); OFF(ibv_qp_init_attr, recv_cq); OFF(ibv_qp_init_attr, srq);
	OFF(ibv_qp_init_attr, cap); OFF(ibv_qp_init_attr, qp_type); OFF(ibv_qp_init_attr, sq_sig_all);
	OFF(ibv_global_route, flow_label); OFF(ibv_global_route, sgid_index); OFF(ibv_global_route, hop_limit);
	OFF(ibv_global_route, traffic_class);
	OFF(ibv_ah_attr, dlid); OFF(ibv_ah_attr, sl); OFF(ibv_ah_attr, src_path_bits); OFF(ibv_ah_attr, static_rate);
	OFF(ibv_ah_attr, is_global); OFF(ibv_ah_attr, port_num);
	OFF(ibv_qp_attr, cur_qp_state); OFF(ibv_qp_attr, path_mtu); OFF(ibv_qp_attr, qkey); OFF(ibv_qp_attr, rq_psn);
	OFF(ibv_qp_attr, sq_psn); OFF(ibv_qp_attr, dest_qp_num); OFF(ibv_qp_attr, qp_access_flags); OFF(ibv_qp_attr, cap);
	OFF(ibv_qp_attr, ah_attr);
	OFF(ibv_qp_attr, alt_ah_attr); OFF(ibv_qp_attr, pkey_index); OFF(ibv_qp_attr, en_sqd_async_notify);
	OFF(ibv_qp_attr, max_rd_atomic); OFF(ibv_qp_attr, max_dest_rd_atomic); OFF(ibv_qp_attr, min_rnr_timer);
	OFF(ibv_qp_attr, port_num); OFF(ibv_qp_attr, timeout); OFF(ibv_qp_attr, retry_cnt); OFF(ibv_qp_attr, rnr_retry);
	OFF(ibv_qp_attr, alt_timeout); OFF(ibv_qp_attr, rate_limit);
	OFF(ibv_srq_init_attr, attr);
	OFF(ibv_async_event, event_type);
	SIZE(verbs_context); SIZE(ibv_port_attr); SIZE(ibv_cq_ex); SIZE(ibv_cq_init_attr_ex); SIZE(ibv_qp_ex);
	SIZE(ibv_qp_init_attr_ex); SIZE(ibv_device_attr_ex); SIZE(ibv_data_buf);
	SIZE(ibv_td); SIZE(ibv_td_init_attr); SIZE(ibv_parent_domain_init_attr); SIZE(ibv_odp_caps);
	SIZE(ibv_dm); SIZE(ibv_alloc_dm_attr);
	OFF(ibv_dm, memcpy_to_dm); OFF(ibv_dm, memcpy_from_dm); OFF(ibv_dm, comp_mask); OFF(ibv_dm, handle);
	OFF(ibv_alloc_dm_attr, log_align_req); OFF(ibv_alloc_dm_attr, comp_mask);
	OFF(verbs_context, reg_dm_mr); OFF(verbs_context, alloc_dm); OFF(verbs_context, free_dm);
	OFF(ibv_parent_domain_init_attr, td); OFF(ibv_parent_domain_init_attr, comp_mask);
	OFF(ibv_parent_domain_init_attr, alloc); OFF(ibv_parent_domain_init_attr, free);
	OFF(ibv_parent_domain_init_attr, pd_context);
	OFF(verbs_context, context);
	OFF(ibv_port_attr, flags); OFF(ibv_port_attr, port_cap_flags2);
	OFF(ibv_cq_ex, comp_mask); OFF(ibv_cq_ex, status); OFF(ibv_cq_ex, wr_id); OFF(ibv_cq_ex, start_poll);
	OFF(ibv_cq_ex, read_opcode); OFF(ibv_cq_ex, read_completion_ts); OFF(ibv_cq_ex, read_completion_wallclock_ns);
	OFF(ibv_cq_init_attr_ex, cq_context); OFF(ibv_cq_init_attr_ex, channel); OFF(ibv_cq_init_attr_ex, comp_vector);
	OFF(ibv_cq_init_attr_ex, wc_flags); OFF(ibv_cq_init_attr_ex, comp_mask); OFF(ibv_cq_init_attr_ex, flags);
	OFF(ibv_cq_init_attr_ex, parent_domain);
	OFF(ibv_qp_ex, comp_mask); OFF(ibv_qp_ex, wr_id); OFF(ibv_qp_ex, wr_flags); OFF(ibv_qp_ex, wr_atomic_cmp_swp);
	OFF(ibv_qp_ex, wr_send_tso); OFF(ibv_qp_ex, wr_set_sge_list); OFF(ibv_qp_ex, wr_start); OFF(ibv_qp_ex, wr_abort);
	OFF(ibv_qp_ex, wr_atomic_write);
	OFF(ibv_qp_init_attr_ex, comp_mask); OFF(ibv_qp_init_attr_ex, pd); OFF(ibv_qp_init_attr_ex, xrcd);
	OFF(ibv_qp_init_attr_ex, create_flags); OFF(ibv_qp_init_attr_ex, max_tso_header);
	OFF(ibv_qp_init_attr_ex, rwq_ind_tbl); OFF(ibv_qp_init_attr_ex, rx_hash_conf);
	OFF(ibv_qp_init_attr_ex, source_qpn); OFF(ibv_qp_init_attr_ex, send_ops_flags);
	OFF(ibv_device_attr_ex, comp_mask); OFF(ibv_device_attr_ex, odp_caps);
	OFF(ibv_device_attr_ex, completion_timestamp_mask); OFF(ibv_device_attr_ex, hca_core_clock);
	OFF(ibv_device_attr_ex, device_cap_flags_ex); OFF(ibv_device_attr_ex, tso_caps); OFF(ibv_device_attr_ex, rss_caps);
	OFF(ibv_device_attr_ex, max_wq_type_rq); OFF(ibv_device_attr_ex, packet_pacing_caps);
	OFF(ibv_device_attr_ex, raw_packet_caps); OFF(ibv_device_attr_ex, tm_caps); OFF(ibv_device_attr_ex, cq_mod_caps);
	OFF(ibv_device_attr_ex, max_dm_size); OFF(ibv_device_attr_ex, pci_atomic_caps);
	OFF(ibv_device_attr_ex, xrc_odp_caps); OFF(ibv_device_attr_ex, phys_port_cnt_ex);
	return 0;
}
