/*
 * The NIXL C API calls this plugin makes, declared in this project's own
 * words from the signatures NIXL documents (nothing here is NIXL's text).
 * Both the binding (binding.go, through function pointers typed from these
 * declarations) and the test fakes (testdata/, which define them) include
 * it, so a definition or a call whose shape drifts from these fails to
 * compile. Handles are opaque pointers and enums are ints: the ABI is the
 * same as NIXL's typed handles.
 *
 * Two layouts exist. NIXL 8770b655's C API has no version call; its agent
 * configuration has an int listen_port at offset 4 and thread_sync at 8.
 * The versioned C API (nixl_capi_get_version reports 0.1.x) has a uint16_t
 * listen_port at offset 2 and thread_sync at 4, and requires every buffer
 * it returns (local metadata, remote agent names) to be released with
 * nixl_capi_mem_free. A fake selects the layout it defines with
 * KVF_NX_AGENT_CONFIG; the binding uses both structs by name.
 */
#ifndef KVF_NIXL_CAPI_H
#define KVF_NIXL_CAPI_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
	KVF_NX_SUCCESS = 0,
	KVF_NX_IN_PROG = 1,
	KVF_NX_MEM_DRAM = 0,
	KVF_NX_OP_WRITE = 1,
	KVF_NX_SYNC_NONE = 0,
	KVF_NX_SYNC_STRICT = 1,
};

/* The agent configuration of NIXL 8770b655 (unversioned). */
struct kvf_nx_agent_config_8770 {
	bool enable_prog_thread;
	bool enable_listen_thread;
	int listen_port;
	int thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
};

/* The agent configuration of the versioned C API 0.1. */
struct kvf_nx_agent_config_v01 {
	bool enable_prog_thread;
	bool enable_listen_thread;
	uint16_t listen_port;
	int thread_sync;
	unsigned int num_workers;
	uint64_t pthr_delay_us;
	uint64_t lthr_delay_us;
	bool capture_telemetry;
};

#ifndef KVF_NX_AGENT_CONFIG
#define KVF_NX_AGENT_CONFIG struct kvf_nx_agent_config_8770
#endif

int nixl_capi_create_agent(const char *name, void **agent);
int nixl_capi_create_configured_agent(const char *name, const KVF_NX_AGENT_CONFIG *cfg, void **agent);
int nixl_capi_get_plugin_params(void *agent, const char *plugin, void **mems, void **params);
int nixl_capi_create_backend(void *agent, const char *plugin, void *params, void **backend);
int nixl_capi_destroy_mem_list(void *mems);
int nixl_capi_destroy_params(void *params);
int nixl_capi_create_opt_args(void **args);
int nixl_capi_opt_args_add_backend(void *args, void *backend);
int nixl_capi_create_reg_dlist(int mem_type, void **dlist);
int nixl_capi_reg_dlist_add_desc(void *dlist, uintptr_t addr, size_t len, uint64_t dev_id, const void *metadata,
                                 size_t metadata_len);
int nixl_capi_destroy_reg_dlist(void *dlist);
int nixl_capi_register_mem(void *agent, void *dlist, void *opt_args);
int nixl_capi_deregister_mem(void *agent, void *dlist, void *opt_args);
int nixl_capi_get_local_md(void *agent, void **data, size_t *len);
int nixl_capi_load_remote_md(void *agent, const void *data, size_t len, char **agent_name);
int nixl_capi_create_xfer_dlist(int mem_type, void **dlist);
int nixl_capi_xfer_dlist_add_desc(void *dlist, uintptr_t addr, size_t len, uint64_t dev_id);
int nixl_capi_destroy_xfer_dlist(void *dlist);
int nixl_capi_create_xfer_req(void *agent, int op, void *local_descs, void *remote_descs, const char *remote_agent,
                              void **req, void *opt_args);
int nixl_capi_post_xfer_req(void *agent, void *req, void *opt_args);
int nixl_capi_get_xfer_status(void *agent, void *req);
int nixl_capi_release_xfer_req(void *agent, void *req);
int nixl_capi_destroy_xfer_req(void *req);

/* The versioned C API only. */
void nixl_capi_get_version(int *major, int *minor, int *patch);
void nixl_capi_mem_free(void *ptr);
#endif
