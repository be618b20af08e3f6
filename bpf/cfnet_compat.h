/* What differs between the two ways tcp_links.c is built, so the program text is one.
 *
 *  CO-RE (the default; CFNET_CORE defined): compiled once at build time by
 *      `clang -target bpf -g -O2 -DCFNET_CORE` against a vmlinux.h that bpftool generated
 *      from BTF (tools/build_bpf.py), loaded by libbpf, which relocates every kernel field
 *      read against the running kernel's BTF.  Parameters are `const volatile` globals in
 *      .rodata (struct cf_config) that the loader sets before load.
 *  BCC (the fallback for kernels without BTF): compiled on the device by BCC's clang;
 *      tracepoint layouts come from tracefs, parameters are -D flags.
 *
 * Map operations, map declarations and program headers are macros here; everything else
 * in tcp_links.c is plain C shared by both.
 */
#ifndef CFNET_COMPAT_H
#define CFNET_COMPAT_H

#ifdef CFNET_CORE
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "cfnet_links.h"

#define CF_MAP(kind, name, K, V, N)                                                          \
    struct {                                                                                 \
        __uint(type, kind);                                                                  \
        __uint(max_entries, N);                                                              \
        __type(key, K);                                                                      \
        __type(value, V);                                                                    \
    } name SEC(".maps")
#define CF_HASH(name, K, V, N) CF_MAP(BPF_MAP_TYPE_HASH, name, K, V, N)
#define CF_LRU_HASH(name, K, V, N) CF_MAP(BPF_MAP_TYPE_LRU_HASH, name, K, V, N)
#define CF_LOOKUP(m, k) bpf_map_lookup_elem(&m, k)
#define CF_UPDATE(m, k, v) bpf_map_update_elem(&m, k, v, BPF_ANY)
#define CF_DELETE(m, k) bpf_map_delete_elem(&m, k)
#define CF_LOOKUP_OR_INIT(m, k, zero) cf_lookup_or_init(&m, k, zero)
/* A tracepoint program; T is the kernel's trace_event_raw_* record (CO-RE relocated). */
#define CF_TRACEPOINT(cat, event, T) SEC("tp/" #cat "/" #event) int cf_##event(T *args)

/* BCC's lookup_or_try_init: insert the zero value if absent (another CPU may win the
 * race; BPF_NOEXIST leaves its entry), then look up again. */
static __always_inline void *cf_lookup_or_init(void *map, const void *key, const void *zero)
{
    void *v = bpf_map_lookup_elem(map, key);
    if (v)
        return v;
    bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
    return bpf_map_lookup_elem(map, key);
}

/* Set by the loader before load (bpf_map__initial_value on .rodata); the verifier then
 * sees constants and prunes the branches they turn off. */
const volatile struct cf_config cf_cfg = {.probe_port = 7946};
#define CF_FILTER_LOCAL (cf_cfg.filter_local)
#define CF_INCLUDE_LOOPBACK (cf_cfg.include_loopback)
#define CF_PROBE_PORT (cf_cfg.probe_port)
#define CF_KERNEL_COUNTERS 1

char LICENSE[] SEC("license") = "GPL";

#else /* BCC */
#include "cfnet_links.h"

#define CF_HASH(name, K, V, N) BPF_HASH(name, K, V, N)
#define CF_LRU_HASH(name, K, V, N) BPF_TABLE("lru_hash", K, V, name, N)
/* BCC rewrites `map.lookup(...)` only where it is written outside a macro ("cannot use map
 * function inside a macro"), so each map operation is a small function, declared after
 * the maps in tcp_links.c (CF_BCC_MAP_OPS), that these names reach by token pasting. */
#define CF_LOOKUP(m, k) cf_bcc_##m##_lookup(k)
#define CF_UPDATE(m, k, v) cf_bcc_##m##_update(k, v)
#define CF_DELETE(m, k) cf_bcc_##m##_delete(k)
#define CF_LOOKUP_OR_INIT(m, k, zero) cf_bcc_##m##_lookup_or_init(k, zero)
#define CF_TRACEPOINT(cat, event, T) TRACEPOINT_PROBE(cat, event)

#ifdef CFNET_FILTER_LOCAL
#define CF_FILTER_LOCAL 1
#else
#define CF_FILTER_LOCAL 0
#endif
#ifdef CFNET_INCLUDE_LOOPBACK
#define CF_INCLUDE_LOOPBACK 1
#else
#define CF_INCLUDE_LOOPBACK 0
#endif
#ifndef CFNET_PROBE_PORT
#define CFNET_PROBE_PORT 7946
#endif
#define CF_PROBE_PORT CFNET_PROBE_PORT
#if defined(CFNET_TP_SEGS_OUT_OFF) && defined(CFNET_TP_TOTAL_RETRANS_OFF)
#define CF_KERNEL_COUNTERS 1
#else
#define CF_KERNEL_COUNTERS 0
#endif
#endif /* CFNET_CORE */

#endif
