// SPDX-License-Identifier: Apache-2.0
//
// drop_from: an XDP program that drops IPv4 and IPv6 packets whose source
// address one of its sets matches (docs/bpf.md, "The XDP program").
//
// Each set is ipsetmgr's pinned outer map: a BPF_MAP_TYPE_ARRAY_OF_MAPS of
// one slot whose inner map is a BPF_MAP_TYPE_LPM_TRIE keyed by (prefix
// length, address bytes) with a one-byte value: 1 = match (drop),
// 0 = nomatch (pass). The program looks up slot 0 on every packet, so a
// set replaced by swapping that slot takes effect at once, without loading
// or attaching the program again.
//
// Up to SETS sets per family: the loader (crates/bpf/src/xdp.rs) points
// v4_set0.. and v6_set0.. at the pinned maps of the sets it is given; the
// slots it leaves unused stay empty maps, whose slot 0 holds no trie, so
// they match nothing.
//
// Self-contained on purpose: no kernel or libbpf headers, so `clang
// -target bpf` from Debian's clang package is all the build needs
// (crates/bpf/build.rs). The few UAPI values used are stable kernel ABI.

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __array(name, val) typeof(val) *name[]

// include/uapi/linux/bpf.h
#define BPF_MAP_TYPE_LPM_TRIE 11
#define BPF_MAP_TYPE_ARRAY_OF_MAPS 12
#define BPF_F_NO_PREALLOC 1
#define XDP_DROP 1
#define XDP_PASS 2

struct xdp_md {
	__u32 data;
	__u32 data_end;
	__u32 data_meta;
	__u32 ingress_ifindex;
	__u32 rx_queue_index;
	__u32 egress_ifindex;
};

// BPF_FUNC_map_lookup_elem is helper 1.
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;

// The LPM trie keys, as crates/bpf/src/key.rs writes them.
struct key4 {
	__u32 prefixlen;
	__u8 addr[4];
};
struct key6 {
	__u32 prefixlen;
	__u8 addr[16];
};

#define SETS 4

// One set: the outer array of one slot, its inner map's shape given as the
// template the kernel checks every inner map against. max_entries of the
// inner map may differ (the kernel compares type, key, value and flags).
#define OUTER(name, key_t)                                              \
	struct {                                                        \
		__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);               \
		__uint(max_entries, 1);                                 \
		__type(key, __u32);                                     \
		__array(values, struct {                                \
			__uint(type, BPF_MAP_TYPE_LPM_TRIE);            \
			__uint(map_flags, BPF_F_NO_PREALLOC);           \
			__uint(max_entries, 1);                         \
			__uint(key_size, sizeof(key_t));                \
			__uint(value_size, 1);                          \
		});                                                     \
	} name SEC(".maps")

OUTER(v4_set0, struct key4);
OUTER(v4_set1, struct key4);
OUTER(v4_set2, struct key4);
OUTER(v4_set3, struct key4);
OUTER(v6_set0, struct key6);
OUTER(v6_set1, struct key6);
OUTER(v6_set2, struct key6);
OUTER(v6_set3, struct key6);

// 1 when the set's longest matching prefix says match, 0 otherwise (no
// trie in the slot, no prefix covers the address, or the most specific one
// is a nomatch entry).
static __attribute__((always_inline)) int matches(void *outer, const void *key)
{
	__u32 slot = 0;
	void *trie = bpf_map_lookup_elem(outer, &slot);
	if (!trie)
		return 0;
	__u8 *verdict = bpf_map_lookup_elem(trie, key);
	return verdict && *verdict == 1;
}

SEC("xdp")
int drop_from(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 *eth = data;

	if (data + 14 > data_end)
		return XDP_PASS;
	__u16 proto = (__u16)(eth[12] << 8 | eth[13]);

	if (proto == 0x0800) {
		__u8 *ip = data + 14;
		if ((void *)(ip + 20) > data_end)
			return XDP_PASS;
		struct key4 key = { .prefixlen = 32 };
		__builtin_memcpy(key.addr, ip + 12, 4);
		if (matches(&v4_set0, &key) || matches(&v4_set1, &key) ||
		    matches(&v4_set2, &key) || matches(&v4_set3, &key))
			return XDP_DROP;
	} else if (proto == 0x86DD) {
		__u8 *ip6 = data + 14;
		if ((void *)(ip6 + 40) > data_end)
			return XDP_PASS;
		struct key6 key = { .prefixlen = 128 };
		__builtin_memcpy(key.addr, ip6 + 8, 16);
		if (matches(&v6_set0, &key) || matches(&v6_set1, &key) ||
		    matches(&v6_set2, &key) || matches(&v6_set3, &key))
			return XDP_DROP;
	}
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Apache-2.0";
