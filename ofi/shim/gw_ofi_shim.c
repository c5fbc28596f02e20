/*
 * gw_ofi_shim: real functions over libfabric's static inline calls.
 *
 * Almost every fi_* call is a static inline wrapper that jumps through an
 * ops table in the object it is given, so Rust cannot call it. This file
 * turns the ones gw-ofi uses into plain functions whose arguments are
 * pointers, integers and the small gw_ofi_* structs below (mirrored by
 * hand in src/ffi.rs); libfabric's own structs never cross the boundary.
 *
 * Nothing here links against libfabric: the six exported (non-inline)
 * functions gw-ofi needs are looked up with dlopen/dlsym when gw_ofi_load
 * runs, so a binary built here still starts where libfabric is absent and
 * reports why it cannot use it. The inline calls only follow function
 * pointers in objects that those six functions created.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

/* The constants src/ffi.rs hard-codes; a change in the headers stops the
 * build here instead of sending a wrong flag. */
_Static_assert(FI_MSG == (1ULL << 1), "FI_MSG");
_Static_assert(FI_RMA == (1ULL << 2), "FI_RMA");
_Static_assert(FI_TAGGED == (1ULL << 3), "FI_TAGGED");
_Static_assert(FI_ATOMIC == (1ULL << 4), "FI_ATOMIC");
_Static_assert(FI_READ == (1ULL << 8), "FI_READ");
_Static_assert(FI_WRITE == (1ULL << 9), "FI_WRITE");
_Static_assert(FI_RECV == (1ULL << 10), "FI_RECV");
_Static_assert(FI_SEND == (1ULL << 11), "FI_SEND");
_Static_assert(FI_REMOTE_READ == (1ULL << 12), "FI_REMOTE_READ");
_Static_assert(FI_REMOTE_WRITE == (1ULL << 13), "FI_REMOTE_WRITE");
_Static_assert(FI_MULTI_RECV == (1ULL << 16), "FI_MULTI_RECV");
_Static_assert(FI_REMOTE_CQ_DATA == (1ULL << 17), "FI_REMOTE_CQ_DATA");
_Static_assert(FI_HMEM == (1ULL << 47), "FI_HMEM");
_Static_assert(FI_LOCAL_COMM == (1ULL << 51), "FI_LOCAL_COMM");
_Static_assert(FI_REMOTE_COMM == (1ULL << 52), "FI_REMOTE_COMM");
_Static_assert(FI_CONTEXT == (1ULL << 59), "FI_CONTEXT");
_Static_assert(FI_MSG_PREFIX == (1ULL << 58), "FI_MSG_PREFIX");
_Static_assert(FI_RX_CQ_DATA == (1ULL << 56), "FI_RX_CQ_DATA");
_Static_assert(FI_LOCAL_MR == (1ULL << 55), "FI_LOCAL_MR");
_Static_assert(FI_CONTEXT2 == (1ULL << 52), "FI_CONTEXT2");
_Static_assert(FI_MR_LOCAL == (1 << 2), "FI_MR_LOCAL");
_Static_assert(FI_MR_RAW == (1 << 3), "FI_MR_RAW");
_Static_assert(FI_MR_VIRT_ADDR == (1 << 4), "FI_MR_VIRT_ADDR");
_Static_assert(FI_MR_ALLOCATED == (1 << 5), "FI_MR_ALLOCATED");
_Static_assert(FI_MR_PROV_KEY == (1 << 6), "FI_MR_PROV_KEY");
_Static_assert(FI_MR_MMU_NOTIFY == (1 << 7), "FI_MR_MMU_NOTIFY");
_Static_assert(FI_MR_RMA_EVENT == (1 << 8), "FI_MR_RMA_EVENT");
_Static_assert(FI_MR_ENDPOINT == (1 << 9), "FI_MR_ENDPOINT");
_Static_assert(FI_MR_HMEM == (1 << 10), "FI_MR_HMEM");
_Static_assert(FI_EAGAIN == 11, "FI_EAGAIN");
_Static_assert(FI_ENOMEM == 12, "FI_ENOMEM");
_Static_assert(FI_EFAULT == 14, "FI_EFAULT");
_Static_assert(FI_EPERM == 1, "FI_EPERM");
_Static_assert(FI_EACCES == 13, "FI_EACCES");
_Static_assert(FI_ENOSYS == 38, "FI_ENOSYS");
_Static_assert(FI_ENODATA == 61, "FI_ENODATA");
_Static_assert(FI_EAVAIL == 259, "FI_EAVAIL");
_Static_assert(FI_ETOOSMALL == 257, "FI_ETOOSMALL");
_Static_assert(FI_ETRUNC == 265, "FI_ETRUNC");
_Static_assert(FI_ECANCELED == 125, "FI_ECANCELED");
_Static_assert(FI_EP_RDM == 3, "FI_EP_RDM");
_Static_assert(FI_PROGRESS_UNSPEC == 0 && FI_PROGRESS_AUTO == 1 &&
		       FI_PROGRESS_MANUAL == 2,
	       "fi_progress");
_Static_assert(FI_THREAD_UNSPEC == 0 && FI_THREAD_SAFE == 1 &&
		       FI_THREAD_FID == 2 && FI_THREAD_DOMAIN == 3 &&
		       FI_THREAD_COMPLETION == 4 && FI_THREAD_ENDPOINT == 5,
	       "fi_threading");

/* ---- run-time loading ------------------------------------------------ */

typedef int (*getinfo_fn)(uint32_t, const char *, const char *, uint64_t,
			  const struct fi_info *, struct fi_info **);
typedef void (*freeinfo_fn)(struct fi_info *);
typedef struct fi_info *(*dupinfo_fn)(const struct fi_info *);
typedef int (*fabric_fn)(struct fi_fabric_attr *, struct fid_fabric **,
			 void *);
typedef const char *(*strerror_fn)(int);
typedef uint32_t (*version_fn)(void);

static struct {
	void *lib;
	getinfo_fn getinfo;
	freeinfo_fn freeinfo;
	dupinfo_fn dupinfo;
	fabric_fn fabric;
	strerror_fn strerror;
	version_fn version;
} gw;

static void put_err(char *err, size_t errlen, const char *what,
		    const char *name, const char *text)
{
	if (err && errlen)
		snprintf(err, errlen, "%s %s: %s", what, name,
			 text ? text : "unknown error");
}

/*
 * Opens `name` and resolves the six exported functions. Returns 0, or -1
 * with "dlopen NAME: TEXT" / "dlsym SYMBOL: TEXT" in err. The symbols are
 * kept only if every one was found, and only the first success is kept:
 * the Rust side calls this once (a OnceLock), and tests call it with a
 * missing name to see the error, which must not disturb a loaded library.
 */
int gw_ofi_load(const char *name, char *err, size_t errlen)
{
	void *lib;
	void *sym[6];
	static const char *names[6] = {"fi_getinfo", "fi_freeinfo",
				       "fi_dupinfo", "fi_fabric",
				       "fi_strerror", "fi_version"};
	int i;

	dlerror();
	lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		put_err(err, errlen, "dlopen", name, dlerror());
		return -1;
	}
	for (i = 0; i < 6; i++) {
		dlerror();
		sym[i] = dlsym(lib, names[i]);
		if (!sym[i]) {
			put_err(err, errlen, "dlsym", names[i], dlerror());
			dlclose(lib);
			return -1;
		}
	}
	if (gw.lib) {
		/* Already loaded: keep the first (its objects may be live). */
		dlclose(lib);
		return 0;
	}
	gw.getinfo = (getinfo_fn)sym[0];
	gw.freeinfo = (freeinfo_fn)sym[1];
	gw.dupinfo = (dupinfo_fn)sym[2];
	gw.fabric = (fabric_fn)sym[3];
	gw.strerror = (strerror_fn)sym[4];
	gw.version = (version_fn)sym[5];
	gw.lib = lib;
	return 0;
}

/* The library's version as FI_VERSION(major, minor); 0 before loading. */
uint32_t gw_ofi_version(void)
{
	return gw.version ? gw.version() : 0;
}

/* The version of the headers this shim was compiled against. */
uint32_t gw_ofi_header_version(void)
{
	return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
}

/* fi_strerror of a positive errno; never NULL. */
const char *gw_ofi_strerror(int errnum)
{
	const char *s = gw.strerror ? gw.strerror(errnum) : NULL;
	return s ? s : "unknown error";
}

/* ---- fi_getinfo and what it negotiated -------------------------------- */

/* Mirrored in src/ffi.rs as GwHints. */
struct gw_ofi_hints {
	const char *prov_name; /* NULL: any provider */
	uint64_t caps;
	uint64_t mode;
	uint64_t mr_mode;
	int32_t ep_type;   /* 0: FI_EP_UNSPEC */
	int32_t threading; /* enum fi_threading */
	int32_t no_hints;  /* non-zero: pass NULL hints (list everything) */
	int32_t pad;
};

/* Mirrored in src/ffi.rs as GwAttr. */
struct gw_ofi_attr {
	uint64_t caps;
	uint64_t mode;
	uint64_t mr_mode;
	uint64_t cq_data_size;
	uint64_t max_msg_size;
	uint64_t inject_size;
	uint64_t tx_size;
	uint64_t rx_size;
	uint64_t mr_key_size;
	uint64_t max_rma_size; /* ep_attr->max_msg_size is the RMA limit too */
	uint64_t cq_cnt;
	uint64_t ep_cnt;
	uint32_t prov_version;
	int32_t ep_type;
	int32_t data_progress;
	int32_t control_progress;
	int32_t threading;
	uint32_t addr_format;
	char prov_name[64];
	char fabric_name[64];
	char domain_name[64];
};

_Static_assert(sizeof(struct gw_ofi_hints) == 48, "gw_ofi_hints size");
_Static_assert(sizeof(struct gw_ofi_attr) == 12 * 8 + 6 * 4 + 3 * 64,
	       "gw_ofi_attr size");

static uint32_t api_version(void)
{
	uint32_t lib = gw_ofi_version();
	uint32_t hdr = gw_ofi_header_version();
	return lib && lib < hdr ? lib : hdr;
}

/* fi_getinfo with the given hints; *out is a list (gw_ofi_info_next). */
int gw_ofi_getinfo(const struct gw_ofi_hints *h, struct fi_info **out)
{
	struct fi_info *hints = NULL;
	int ret;

	*out = NULL;
	if (!gw.getinfo)
		return -FI_ENOSYS;
	if (!h->no_hints) {
		hints = gw.dupinfo(NULL); /* fi_allocinfo() */
		if (!hints)
			return -FI_ENOMEM;
		hints->caps = h->caps;
		hints->mode = h->mode;
		hints->ep_attr->type = (enum fi_ep_type)h->ep_type;
		hints->domain_attr->mr_mode = (int)h->mr_mode;
		hints->domain_attr->threading =
			(enum fi_threading)h->threading;
		if (h->prov_name) {
			/* fi_freeinfo frees it; the caller's string stays. */
			hints->fabric_attr->prov_name = strdup(h->prov_name);
			if (!hints->fabric_attr->prov_name) {
				gw.freeinfo(hints);
				return -FI_ENOMEM;
			}
		}
	}
	ret = gw.getinfo(api_version(), NULL, NULL, 0, hints, out);
	if (hints)
		gw.freeinfo(hints);
	return ret;
}

struct fi_info *gw_ofi_info_next(const struct fi_info *info)
{
	return info ? info->next : NULL;
}

/* One entry of a list, alone (fi_dupinfo copies one entry, next = NULL). */
struct fi_info *gw_ofi_info_dup(const struct fi_info *info)
{
	return gw.dupinfo ? gw.dupinfo(info) : NULL;
}

void gw_ofi_freeinfo(struct fi_info *info)
{
	if (info && gw.freeinfo)
		gw.freeinfo(info);
}

static void copy_name(char *dst, const char *src)
{
	size_t n;

	if (!src) {
		dst[0] = 0;
		return;
	}
	n = strlen(src);
	if (n > 63)
		n = 63;
	memcpy(dst, src, n);
	dst[n] = 0;
}

void gw_ofi_info_attr(const struct fi_info *info, struct gw_ofi_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->caps = info->caps;
	a->mode = info->mode;
	a->addr_format = info->addr_format;
	if (info->fabric_attr) {
		copy_name(a->prov_name, info->fabric_attr->prov_name);
		copy_name(a->fabric_name, info->fabric_attr->name);
		a->prov_version = info->fabric_attr->prov_version;
	}
	if (info->domain_attr) {
		struct fi_domain_attr *d = info->domain_attr;
		copy_name(a->domain_name, d->name);
		a->mr_mode = (uint64_t)(unsigned)d->mr_mode;
		a->cq_data_size = d->cq_data_size;
		a->mr_key_size = d->mr_key_size;
		a->data_progress = d->data_progress;
		a->control_progress = d->control_progress;
		a->threading = d->threading;
		a->cq_cnt = d->cq_cnt;
		a->ep_cnt = d->ep_cnt;
	}
	if (info->ep_attr) {
		a->ep_type = info->ep_attr->type;
		a->max_msg_size = info->ep_attr->max_msg_size;
		a->max_rma_size = info->ep_attr->max_msg_size;
	}
	if (info->tx_attr) {
		a->inject_size = info->tx_attr->inject_size;
		a->tx_size = info->tx_attr->size;
	}
	if (info->rx_attr)
		a->rx_size = info->rx_attr->size;
}

/* ---- objects ----------------------------------------------------------- */

int gw_ofi_fabric_open(struct fi_info *info, struct fid_fabric **fabric)
{
	*fabric = NULL;
	if (!gw.fabric)
		return -FI_ENOSYS;
	return gw.fabric(info->fabric_attr, fabric, NULL);
}

int gw_ofi_domain_open(struct fid_fabric *fabric, struct fi_info *info,
		       struct fid_domain **domain)
{
	*domain = NULL;
	return fi_domain(fabric, info, domain, NULL);
}

/* A completion queue of FI_CQ_FORMAT_DATA entries; wait_fd non-zero asks
 * for FI_WAIT_FD, else FI_WAIT_NONE. */
int gw_ofi_cq_open(struct fid_domain *domain, size_t size, int wait_fd,
		   struct fid_cq **cq)
{
	struct fi_cq_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.size = size;
	attr.format = FI_CQ_FORMAT_DATA;
	attr.wait_obj = wait_fd ? FI_WAIT_FD : FI_WAIT_NONE;
	attr.wait_cond = FI_CQ_COND_NONE;
	*cq = NULL;
	return fi_cq_open(domain, &attr, cq, NULL);
}

/* The CQ's file descriptor (fi_control FI_GETWAIT). */
int gw_ofi_cq_wait_fd(struct fid_cq *cq, int *fd)
{
	*fd = -1;
	return fi_control(&cq->fid, FI_GETWAIT, fd);
}

/* fi_trywait on one CQ: 0 when it is safe to sleep on its fd, -FI_EAGAIN
 * when completions may be pending and the CQ must be read first. */
int gw_ofi_trywait(struct fid_fabric *fabric, struct fid_cq *cq)
{
	struct fid *fids[1];

	fids[0] = &cq->fid;
	return fi_trywait(fabric, fids, 1);
}

int gw_ofi_av_open(struct fid_domain *domain, size_t count,
		   struct fid_av **av)
{
	struct fi_av_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.type = FI_AV_TABLE;
	attr.count = count;
	*av = NULL;
	return fi_av_open(domain, &attr, av, NULL);
}

int gw_ofi_ep_open(struct fid_domain *domain, struct fi_info *info,
		   struct fid_ep **ep)
{
	*ep = NULL;
	return fi_endpoint(domain, info, ep, NULL);
}

/* Binds the CQ for sends and receives and the AV, then enables. */
int gw_ofi_ep_setup(struct fid_ep *ep, struct fid_cq *cq, struct fid_av *av)
{
	int ret;

	ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
	if (ret)
		return ret;
	ret = fi_ep_bind(ep, &av->fid, 0);
	if (ret)
		return ret;
	return fi_enable(ep);
}

/* fi_close of any object the shim opened. */
int gw_ofi_close(struct fid *fid)
{
	return fid ? fi_close(fid) : 0;
}

int gw_ofi_getname(struct fid_ep *ep, void *buf, size_t *len)
{
	return fi_getname(&ep->fid, buf, len);
}

/* Inserts one address; returns 0 with *out set, or a negative errno. */
int gw_ofi_av_insert(struct fid_av *av, const void *addr, uint64_t *out)
{
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	int ret = fi_av_insert(av, addr, 1, &a, 0, NULL);

	if (ret < 0)
		return ret;
	if (ret != 1 || a == FI_ADDR_NOTAVAIL)
		return -FI_EADDRNOTAVAIL;
	*out = a;
	return 0;
}

/* ---- memory registration --------------------------------------------- */

int gw_ofi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
		  uint64_t access, uint64_t requested_key, struct fid_mr **mr)
{
	*mr = NULL;
	return fi_mr_reg(domain, buf, len, access, 0, requested_key, 0, mr,
			 NULL);
}

/* Device memory (FI_HMEM): `iface` is an enum fi_hmem_iface (FI_HMEM_CUDA
 * is 1) and `device` its device ordinal. The fabric must have been opened
 * with FI_HMEM. */
int gw_ofi_mr_reg_hmem(struct fid_domain *domain, const void *buf,
		       size_t len, uint64_t access, uint64_t requested_key,
		       int iface, int device, struct fid_mr **mr)
{
	struct iovec iov;
	struct fi_mr_attr attr;

	iov.iov_base = (void *)buf;
	iov.iov_len = len;
	memset(&attr, 0, sizeof(attr));
	attr.mr_iov = &iov;
	attr.iov_count = 1;
	attr.access = access;
	attr.requested_key = requested_key;
	attr.iface = (enum fi_hmem_iface)iface;
	attr.device.cuda = device;
	*mr = NULL;
	return fi_mr_regattr(domain, &attr, 0, mr);
}

/* FI_MR_ENDPOINT: bind to the endpoint, then enable. */
int gw_ofi_mr_bind_ep(struct fid_mr *mr, struct fid_ep *ep)
{
	int ret = fi_mr_bind(mr, &ep->fid, 0);

	if (ret)
		return ret;
	return fi_mr_enable(mr);
}

uint64_t gw_ofi_mr_key(struct fid_mr *mr)
{
	return fi_mr_key(mr);
}

void *gw_ofi_mr_desc(struct fid_mr *mr)
{
	return fi_mr_desc(mr);
}

/* ---- data transfer ----------------------------------------------------- */
/* ctx points to caller-owned storage of at least 64 bytes (a struct
 * fi_context2), alive until the operation's completion is read. */

ssize_t gw_ofi_send(struct fid_ep *ep, const void *buf, size_t len,
		    void *desc, uint64_t dest, void *ctx)
{
	return fi_send(ep, buf, len, desc, dest, ctx);
}

ssize_t gw_ofi_inject(struct fid_ep *ep, const void *buf, size_t len,
		      uint64_t dest)
{
	return fi_inject(ep, buf, len, dest);
}

ssize_t gw_ofi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
		    void *ctx)
{
	return fi_recv(ep, buf, len, desc, FI_ADDR_UNSPEC, ctx);
}

ssize_t gw_ofi_write(struct fid_ep *ep, const void *buf, size_t len,
		     void *desc, uint64_t dest, uint64_t addr, uint64_t key,
		     void *ctx)
{
	return fi_write(ep, buf, len, desc, dest, addr, key, ctx);
}

ssize_t gw_ofi_writedata(struct fid_ep *ep, const void *buf, size_t len,
			 void *desc, uint64_t data, uint64_t dest,
			 uint64_t addr, uint64_t key, void *ctx)
{
	return fi_writedata(ep, buf, len, desc, data, dest, addr, key, ctx);
}

ssize_t gw_ofi_read(struct fid_ep *ep, void *buf, size_t len, void *desc,
		    uint64_t src, uint64_t addr, uint64_t key, void *ctx)
{
	return fi_read(ep, buf, len, desc, src, addr, key, ctx);
}

/* ---- completions --------------------------------------------------------- */

/* Mirrored in src/ffi.rs as GwCqe. */
struct gw_ofi_cqe {
	uint64_t ctx; /* op_context, as an integer */
	uint64_t flags;
	uint64_t len;
	uint64_t data;
};

/* Mirrored in src/ffi.rs as GwCqErr. */
struct gw_ofi_cqerr {
	uint64_t ctx;
	uint64_t flags;
	uint64_t len;
	uint64_t data;
	int32_t err;
	int32_t prov_errno;
	char text[256];
};

_Static_assert(sizeof(struct gw_ofi_cqe) == 32, "gw_ofi_cqe size");
_Static_assert(sizeof(struct gw_ofi_cqerr) == 32 + 8 + 256,
	       "gw_ofi_cqerr size");

#define GW_CQ_BATCH 64

/* Reads up to count completions; returns how many, or a negative errno
 * (-FI_EAGAIN: none, -FI_EAVAIL: an error entry is waiting). */
ssize_t gw_ofi_cq_read(struct fid_cq *cq, struct gw_ofi_cqe *out,
		       size_t count)
{
	struct fi_cq_data_entry e[GW_CQ_BATCH];
	ssize_t n, i;

	if (count > GW_CQ_BATCH)
		count = GW_CQ_BATCH;
	n = fi_cq_read(cq, e, count);
	for (i = 0; i < n; i++) {
		out[i].ctx = (uint64_t)(uintptr_t)e[i].op_context;
		out[i].flags = e[i].flags;
		out[i].len = e[i].len;
		out[i].data = e[i].data;
	}
	return n;
}

/* Reads one error entry with its provider text (fi_cq_strerror). Returns
 * 1, or a negative errno. */
ssize_t gw_ofi_cq_readerr(struct fid_cq *cq, struct gw_ofi_cqerr *out)
{
	struct fi_cq_err_entry e;
	const char *s;
	ssize_t ret;

	memset(&e, 0, sizeof(e));
	memset(out, 0, sizeof(*out));
	ret = fi_cq_readerr(cq, &e, 0);
	if (ret < 0)
		return ret;
	out->ctx = (uint64_t)(uintptr_t)e.op_context;
	out->flags = e.flags;
	out->len = e.len;
	out->data = e.data;
	out->err = e.err;
	out->prov_errno = e.prov_errno;
	s = fi_cq_strerror(cq, e.prov_errno, e.err_data, out->text,
			   sizeof(out->text));
	if (s && s != out->text)
		snprintf(out->text, sizeof(out->text), "%s", s);
	out->text[sizeof(out->text) - 1] = 0;
	return 1;
}
