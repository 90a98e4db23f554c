/* The layout facts of rdma-core's infiniband/verbs.h that src/abi.rs hardcodes, one
 * "name value" line each, in abi::layout_report()'s order, then the mlx5dv.h structures
 * that src/dr.rs and src/vfio.rs read (tests/answers.rs compares). */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#define P(name, value) printf("%s %zu\n", name, (size_t)(value))

int main(void)
{
	P("context.device", offsetof(struct ibv_context, device));
	P("context.abi_compat", offsetof(struct ibv_context, abi_compat));
	P("verbs_context.query_port", offsetof(struct verbs_context, query_port));
	P("verbs_context.query_device_ex", offsetof(struct verbs_context, query_device_ex));
	P("verbs_context.sz", offsetof(struct verbs_context, sz));
	P("verbs_context.context", offsetof(struct verbs_context, context));
	P("sizeof(verbs_context)", sizeof(struct verbs_context));
	P("sizeof(ibv_port_attr)", sizeof(struct ibv_port_attr));
	P("port_attr.link_layer", offsetof(struct ibv_port_attr, link_layer));
	P("sizeof(ibv_device_attr_ex)", sizeof(struct ibv_device_attr_ex));
	P("device_attr_ex.orig_attr.fw_ver",
	  offsetof(struct ibv_device_attr_ex, orig_attr) + offsetof(struct ibv_device_attr, fw_ver));
	P("device.dev_name", offsetof(struct ibv_device, dev_name));
	P("qp.qp_type", offsetof(struct ibv_qp, qp_type));
	P("IBV_QPT_RAW_PACKET", IBV_QPT_RAW_PACKET);
	P("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET);
	P("flow_sampler_attr.sample_ratio", offsetof(struct mlx5dv_dr_flow_sampler_attr, sample_ratio));
	P("flow_sampler_attr.default_next_table", offsetof(struct mlx5dv_dr_flow_sampler_attr, default_next_table));
	P("flow_sampler_attr.num_sample_actions", offsetof(struct mlx5dv_dr_flow_sampler_attr, num_sample_actions));
	P("flow_sampler_attr.sample_actions", offsetof(struct mlx5dv_dr_flow_sampler_attr, sample_actions));
	P("sizeof(flow_sampler_attr)", sizeof(struct mlx5dv_dr_flow_sampler_attr));
	P("flow_meter_attr.next_table", offsetof(struct mlx5dv_dr_flow_meter_attr, next_table));
	P("dest_attr.type", offsetof(struct mlx5dv_dr_action_dest_attr, type));
	P("dest_attr.dest", offsetof(struct mlx5dv_dr_action_dest_attr, dest));
	P("dest_attr.dest_reformat", offsetof(struct mlx5dv_dr_action_dest_attr, dest_reformat));
	P("dest_reformat.reformat", offsetof(struct mlx5dv_dr_action_dest_reformat, reformat));
	P("dest_reformat.dest", offsetof(struct mlx5dv_dr_action_dest_reformat, dest));
	P("vfio_context_attr.pci_name", offsetof(struct mlx5dv_vfio_context_attr, pci_name));
	P("vfio_context_attr.flags", offsetof(struct mlx5dv_vfio_context_attr, flags));
	P("vfio_context_attr.comp_mask", offsetof(struct mlx5dv_vfio_context_attr, comp_mask));
	P("MLX5DV_DR_DOMAIN_TYPE_FDB", MLX5DV_DR_DOMAIN_TYPE_FDB);
	P("MLX5DV_DR_ACTION_FLAGS_ROOT_LEVEL", MLX5DV_DR_ACTION_FLAGS_ROOT_LEVEL);
	P("MLX5DV_DR_ACTION_DEST_REFORMAT", MLX5DV_DR_ACTION_DEST_REFORMAT);
	P("MLX5DV_OBJ_QP|CQ|SRQ|RWQ|DM|AH|PD", MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ | MLX5DV_OBJ_SRQ | MLX5DV_OBJ_RWQ |
	  MLX5DV_OBJ_DM | MLX5DV_OBJ_AH | MLX5DV_OBJ_PD);
	P("MLX5DV_VFIO_CTX_FLAGS_INIT_LINK_DOWN", MLX5DV_VFIO_CTX_FLAGS_INIT_LINK_DOWN);
	return 0;
}
