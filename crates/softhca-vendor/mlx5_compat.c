/* mlx5dv_init_obj@MLX5_1.0: the compatibility version of mlx5dv_init_obj that rdma-core's
 * libmlx5 keeps for programs built before MLX5_1.2, linked into libmlx5.so.1 only (by
 * scripts/build-libibverbs and the tests). The default version, mlx5dv_init_obj@@MLX5_1.2,
 * is the Rust function of that name. This one cannot be in the Rust archive: a versioned
 * symbol there would need an MLX5_1.0 node in libefa.so.1's version script too. It forwards
 * to the Rust implementation of the compatibility entry (see src/mlx5.rs), which
 * libmlx5.map keeps local. */
#include <stdint.h>

int softhca_vendor_mlx5dv_init_obj_1_0(void *obj, uint64_t obj_type);

__asm__(".symver softhca_vendor_mlx5dv_init_obj_compat, mlx5dv_init_obj@MLX5_1.0");

int softhca_vendor_mlx5dv_init_obj_compat(void *obj, uint64_t obj_type)
{
	return softhca_vendor_mlx5dv_init_obj_1_0(obj, obj_type);
}
