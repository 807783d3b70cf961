/* Shared harness of the fi_apps programs: ordinary libfabric applications that know nothing of
 * compcntr (they include only libfabric's headers and link only libfabric), so that running them
 * with and without FI_HOOK=compcntr shows whether the hook changes anything an application sees.
 *
 * Each program is a client/server pair, as libfabric's fabtests are: main() forks before any
 * libfabric call; the parent is the server, the child the client. Each process opens its own
 * fabric, domain, address vector and one FI_EP_RDM endpoint (127.0.0.1 for the IP providers);
 * the two exchange endpoint names, memory keys and barrier bytes over a socketpair (out of band,
 * like fabtests' -b option), never through timing. Output is deterministic: every line a process
 * prints is buffered, and at the end the server prints its lines and then the client's, each
 * prefixed by the role. No line holds a time, a pid, an address or a key.
 *
 * Every libfabric call is checked; a failure prints the call, its return value and fi_strerror,
 * and the process exits 1 (the other one is then stopped). Run time is bounded: every wait has a
 * timeout (APP_WAIT_MS) and alarm(APP_ALARM_S) ends a process that is stuck anyway.
 *
 * The last line of each role is "fi_cntr_open calls: N": the number of fi_cntr_open calls that
 * process made (successful or not), which the runner (run.py) compares with the hook's stats.
 *
 * Usage of every program: PROGRAM -p <provider>   e.g. -p "tcp;ofi_rxm", "udp;ofi_rxd", shm, sockets
 */
#ifndef FI_APPS_H
#define FI_APPS_H

#define _GNU_SOURCE
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_trigger.h>

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define APP_WAIT_MS 10000  /* any single wait: far above a loopback round trip, bounds a hang */
#define APP_ALARM_S 60     /* whole process: a safety net behind the per-wait timeouts */
#define APP_OUT_MAX                                                                                \
	32768  /* buffered output per process; below a pipe's 64 KiB so the client's
                              report never blocks (the programs print a few dozen lines) */
#define APP_MAX_FIDS 64

enum { ROLE_SERVER = 0, ROLE_CLIENT = 1 };

struct app {
	const char *prov;          /* -p argument, as given */
	const char *prog;
	int role;
	const char *tag;           /* "server" / "client" */
	int sock;           /* socketpair end shared with the peer process */
	int report; /* pipe: client writes its output, server reads it at the end */
	pid_t child; /* server only */
	int cntr_opens; /* fi_cntr_open calls made */
	struct fi_info *hints, *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_ep *ep;
	fi_addr_t peer;
	/* what app_pump drives, and what app_finish closes (in reverse order of registration) */
	struct fid_cntr *pump_cntr[APP_MAX_FIDS];
	int npump_cntr;
	struct fid_cq *pump_cq[APP_MAX_FIDS];
	int npump_cq;
	struct fid *owned[APP_MAX_FIDS];
	int nowned;
	char out[APP_OUT_MAX];
	size_t outlen;
};

static inline void app_finish(struct app *a, int status);

/* ---- output ---------------------------------------------------------------------------- */

static inline void app_vout(struct app *a, const char *fmt, va_list ap)
{
	int n = snprintf(a->out + a->outlen, sizeof a->out - a->outlen, "%s: ", a->tag);
	if (n > 0 && (size_t)n < sizeof a->out - a->outlen)
		a->outlen += (size_t)n;
	n = vsnprintf(a->out + a->outlen, sizeof a->out - a->outlen, fmt, ap);
	if (n > 0 && (size_t)n < sizeof a->out - a->outlen)
		a->outlen += (size_t)n;
	if (a->outlen < sizeof a->out - 1)
		a->out[a->outlen++] = '\n';
}

__attribute__((format(printf, 2, 3))) static inline void out(struct app *a, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	app_vout(a, fmt, ap);
	va_end(ap);
}

__attribute__((format(printf, 2, 3), noreturn)) static inline void die(struct app *a,
                                                                       const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	out(a, "FAILED: %s", line);
	app_finish(a, 1);
	exit(1); /* not reached */
}

/* The name of a (negative) libfabric return value, e.g. "-FI_ETIMEDOUT", for stable output. */
static inline const char *errname(int ret)
{
	static char other[2][48];
	static int k;
	if (ret > 0) { /* some providers return positive errno values (sockets' fi_cntr_wait) */
		const char *n = errname(-ret);
		k ^= 1;
		snprintf(other[k], sizeof other[k], "%d (positive; %s negated)", ret, n);
		return other[k];
	}
	switch (ret) {
	case 0:
		return "0";
	case -FI_EPERM:
		return "-FI_EPERM";
	case -FI_ENOENT:
		return "-FI_ENOENT";
	case -FI_EINTR:
		return "-FI_EINTR";
	case -FI_EIO:
		return "-FI_EIO";
	case -FI_E2BIG:
		return "-FI_E2BIG";
	case -FI_EBADF:
		return "-FI_EBADF";
	case -FI_EAGAIN:
		return "-FI_EAGAIN";
	case -FI_ENOMEM:
		return "-FI_ENOMEM";
	case -FI_EACCES:
		return "-FI_EACCES";
	case -FI_EFAULT:
		return "-FI_EFAULT";
	case -FI_EBUSY:
		return "-FI_EBUSY";
	case -FI_ENODEV:
		return "-FI_ENODEV";
	case -FI_EINVAL:
		return "-FI_EINVAL";
	case -FI_EMFILE:
		return "-FI_EMFILE";
	case -FI_ENOSPC:
		return "-FI_ENOSPC";
	case -FI_ENOSYS:
		return "-FI_ENOSYS";
	case -FI_ENOMSG:
		return "-FI_ENOMSG";
	case -FI_ENODATA:
		return "-FI_ENODATA";
	case -FI_EOVERFLOW:
		return "-FI_EOVERFLOW";
	case -FI_EMSGSIZE:
		return "-FI_EMSGSIZE";
	case -FI_ENOPROTOOPT:
		return "-FI_ENOPROTOOPT";
	case -FI_EOPNOTSUPP:
		return "-FI_EOPNOTSUPP";
	case -FI_EADDRINUSE:
		return "-FI_EADDRINUSE";
	case -FI_EADDRNOTAVAIL:
		return "-FI_EADDRNOTAVAIL";
	case -FI_ENETDOWN:
		return "-FI_ENETDOWN";
	case -FI_ENETUNREACH:
		return "-FI_ENETUNREACH";
	case -FI_ECONNABORTED:
		return "-FI_ECONNABORTED";
	case -FI_ECONNRESET:
		return "-FI_ECONNRESET";
	case -FI_ENOBUFS:
		return "-FI_ENOBUFS";
	case -FI_EISCONN:
		return "-FI_EISCONN";
	case -FI_ENOTCONN:
		return "-FI_ENOTCONN";
	case -FI_ESHUTDOWN:
		return "-FI_ESHUTDOWN";
	case -FI_ETIMEDOUT:
		return "-FI_ETIMEDOUT";
	case -FI_ECONNREFUSED:
		return "-FI_ECONNREFUSED";
	case -FI_EHOSTDOWN:
		return "-FI_EHOSTDOWN";
	case -FI_EHOSTUNREACH:
		return "-FI_EHOSTUNREACH";
	case -FI_EALREADY:
		return "-FI_EALREADY";
	case -FI_EINPROGRESS:
		return "-FI_EINPROGRESS";
	case -FI_EREMOTEIO:
		return "-FI_EREMOTEIO";
	case -FI_ECANCELED:
		return "-FI_ECANCELED";
	case -FI_EKEYREJECTED:
		return "-FI_EKEYREJECTED";
	case -FI_EOTHER:
		return "-FI_EOTHER";
	case -FI_ETOOSMALL:
		return "-FI_ETOOSMALL";
	case -FI_EOPBADSTATE:
		return "-FI_EOPBADSTATE";
	case -FI_EAVAIL:
		return "-FI_EAVAIL";
	case -FI_EBADFLAGS:
		return "-FI_EBADFLAGS";
	case -FI_ENOEQ:
		return "-FI_ENOEQ";
	case -FI_EDOMAIN:
		return "-FI_EDOMAIN";
	case -FI_ENOCQ:
		return "-FI_ENOCQ";
	case -FI_ECRC:
		return "-FI_ECRC";
	case -FI_ETRUNC:
		return "-FI_ETRUNC";
	case -FI_ENOKEY:
		return "-FI_ENOKEY";
	case -FI_ENOAV:
		return "-FI_ENOAV";
	case -FI_EOVERRUN:
		return "-FI_EOVERRUN";
	default:
		k ^= 1;
		snprintf(other[k], sizeof other[k], "%d", ret);
		return other[k];
	}
}

/* "<name> (<fi_strerror text>)" of a return value; the buffer is static (one use per line). */
static inline const char *errstr(int ret)
{
	static char s[2][160];
	static int k;
	k ^= 1;
	snprintf(s[k], sizeof s[k], "%s (%s)", errname(ret),
	         ret ? fi_strerror(ret < 0 ? -ret : ret) : "success");
	return s[k];
}

/* Completion flags in symbolic form, e.g. "FI_MSG|FI_RECV" ("0" when none). */
static inline const char *flagstr(uint64_t f)
{
	static char s[2][256];
	static int k;
	static const struct {
		uint64_t bit;
		const char *name;
	} names[] = {
		{ FI_MSG, "FI_MSG" },
		{ FI_RMA, "FI_RMA" },
		{ FI_TAGGED, "FI_TAGGED" },
		{ FI_ATOMIC, "FI_ATOMIC" },
		{ FI_SEND, "FI_SEND" },
		{ FI_RECV, "FI_RECV" },
		{ FI_READ, "FI_READ" },
		{ FI_WRITE, "FI_WRITE" },
		{ FI_REMOTE_READ, "FI_REMOTE_READ" },
		{ FI_REMOTE_WRITE, "FI_REMOTE_WRITE" },
		{ FI_REMOTE_CQ_DATA, "FI_REMOTE_CQ_DATA" },
		{ FI_MULTI_RECV, "FI_MULTI_RECV" },
	};
	k ^= 1;
	char *p = s[k];
	size_t len = 0;
	p[0] = 0;
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (f & names[i].bit) {
			len += (size_t)snprintf(p + len, sizeof s[k] - len, "%s%s", len ? "|" : "",
			                        names[i].name);
			f &= ~names[i].bit;
		}
	if (f)
		snprintf(p + len, sizeof s[k] - len, "%s0x%llx", len ? "|" : "",
		         (unsigned long long)f);
	else if (!len)
		snprintf(p, sizeof s[k], "0");
	return p;
}

/* Any libfabric call that must succeed: prints call, value and reason and ends the run if not. */
#define CHECK(a, call)                                                                             \
	do {                                                                                       \
		int check_ret_ = (int)(call);                                                      \
		if (check_ret_)                                                                    \
			die((a), "%s = %s", #call, errstr(check_ret_));                            \
	} while (0)

/* ---- out-of-band channel (socketpair) -------------------------------------------------- */

static inline void oob_send(struct app *a, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t n = write(a->sock, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die(a, "out-of-band write: %s", n < 0 ? strerror(errno) : "closed");
		p += n;
		len -= (size_t)n;
	}
}

static inline void oob_recv(struct app *a, void *buf, size_t len)
{
	char *p = buf;
	while (len) {
		struct pollfd pfd = { .fd = a->sock, .events = POLLIN };
		int r = poll(&pfd, 1, APP_WAIT_MS);
		if (r == 0)
			die(a, "out-of-band read: peer silent for %d ms", APP_WAIT_MS);
		if (r < 0 && errno == EINTR)
			continue;
		ssize_t n = read(a->sock, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die(a, "out-of-band read: %s", n < 0 ? strerror(errno) : "peer gone");
		p += n;
		len -= (size_t)n;
	}
}

static inline void oob_send_u64(struct app *a, uint64_t v)
{
	oob_send(a, &v, sizeof v);
}
static inline uint64_t oob_recv_u64(struct app *a)
{
	uint64_t v;
	oob_recv(a, &v, sizeof v);
	return v;
}

/* ---- progress ------------------------------------------------------------------------- */

/* One round of manual progress: read every registered counter (fi_cntr_read drives the
 * provider's progress on the endpoints bound to it) and poll every registered CQ without
 * consuming entries (count 0). */
static inline void app_pump(struct app *a)
{
	for (int i = 0; i < a->npump_cntr; i++)
		(void)fi_cntr_read(a->pump_cntr[i]);
	for (int i = 0; i < a->npump_cq; i++) {
		char none[64];
		(void)fi_cq_read(a->pump_cq[i], none, 0);
	}
}

static inline int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Both processes meet here; each keeps driving its own progress while it waits for the other
 * (a reliable provider's acknowledgements need the receiver's progress). */
static inline void app_barrier(struct app *a)
{
	char b = 'b';
	oob_send(a, &b, 1);
	const int64_t deadline = now_ms() + APP_WAIT_MS;
	for (;;) {
		struct pollfd pfd = { .fd = a->sock, .events = POLLIN };
		int r = poll(&pfd, 1, 1);
		if (r > 0) {
			ssize_t n = read(a->sock, &b, 1);
			if (n == 1)
				return;
			die(a, "barrier: peer gone");
		}
		if (r < 0 && errno != EINTR)
			die(a, "barrier: poll: %s", strerror(errno));
		if (now_ms() > deadline)
			die(a, "barrier: peer did not arrive within %d ms", APP_WAIT_MS);
		app_pump(a);
	}
}

/* Posts an operation, retrying -FI_EAGAIN with progress in between (bounded). */
#define POST(a, what, call)                                                                        \
	do {                                                                                       \
		const int64_t post_deadline_ = now_ms() + APP_WAIT_MS;                             \
		ssize_t post_ret_;                                                                 \
		while ((post_ret_ = (call)) == -FI_EAGAIN && now_ms() < post_deadline_)            \
			app_pump(a);                                                               \
		if (post_ret_)                                                                     \
			die((a), "%s: %s = %s", (what), #call, errstr((int)post_ret_));            \
	} while (0)

/* Waits on a counter with fi_cntr_wait until APP_WAIT_MS have passed; anything but success
 * ends the run. A timed-out wait is retried in slices (as a robust application does): libfabric
 * 1.17's sockets provider returns +FI_ETIMEDOUT at once from any wait with a timeout (its
 * condition-variable deadline is computed on the wrong clock), so one long wait would fail
 * there without anything being wrong with the traffic. */
static inline void wait_cntr(struct app *a, struct fid_cntr *c, uint64_t threshold,
                             const char *what)
{
	const int64_t deadline = now_ms() + APP_WAIT_MS;
	int ret;
	while ((ret = fi_cntr_wait(c, threshold, 1000)) == -FI_ETIMEDOUT || ret == FI_ETIMEDOUT) {
		if (now_ms() > deadline)
			break;
		sched_yield(); /* sockets returns at once: let its progress thread run */
	}
	if (ret)
		die(a, "fi_cntr_wait(%s, %llu, %d) = %s (value %llu, errors %llu)", what,
		    (unsigned long long)threshold, APP_WAIT_MS, errstr(ret),
		    (unsigned long long)fi_cntr_read(c), (unsigned long long)fi_cntr_readerr(c));
}

/* ---- set-up ----------------------------------------------------------------------------- */

static inline void app_own(struct app *a, struct fid *f)
{
	if (a->nowned == APP_MAX_FIDS)
		die(a, "too many objects");
	a->owned[a->nowned++] = f;
}

static struct app *alarm_app;

/* SIGALRM: a process stuck past APP_ALARM_S prints what it has and why it stops (write(2) is
 * async-signal-safe; the report channel is not used, so the server marks the client as lost). */
static inline void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] = ": FAILED: still running after the alarm; stopped\n";
	if (alarm_app) {
		if (write(1, alarm_app->out, alarm_app->outlen) < 0 ||
		    write(1, alarm_app->tag, strlen(alarm_app->tag)) < 0 ||
		    write(1, msg, sizeof msg - 1) < 0)
			_exit(3);
	}
	_exit(3);
}

static inline void usage(const char *prog)
{
	fprintf(stderr,
	        "usage: %s -p <provider>   (e.g. \"tcp;ofi_rxm\", \"udp;ofi_rxd\", shm, sockets)\n",
	        prog);
	exit(2);
}

/* Parses -p, forks, and returns in both processes (a->role says which). */
static inline void app_start(struct app *a, int argc, char **argv)
{
	memset(a, 0, sizeof *a);
	a->prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	int opt;
	while ((opt = getopt(argc, argv, "p:h")) != -1) {
		if (opt == 'p')
			a->prov = optarg;
		else
			usage(a->prog);
	}
	if (!a->prov || optind != argc)
		usage(a->prog);
	setvbuf(stdout, NULL, _IOFBF, 0);
	int sv[2], rp[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) || pipe(rp)) {
		perror("socketpair/pipe");
		exit(1);
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(1);
	}
	a->role = pid == 0 ? ROLE_CLIENT : ROLE_SERVER;
	a->tag = pid == 0 ? "client" : "server";
	a->child = pid;
	a->sock = pid == 0 ? sv[1] : sv[0];
	close(pid == 0 ? sv[0] : sv[1]);
	a->report = pid == 0 ? rp[1] : rp[0];
	close(pid == 0 ? rp[0] : rp[1]);
	a->peer = FI_ADDR_UNSPEC;
	alarm_app = a;
	signal(SIGALRM, on_alarm);
	signal(SIGPIPE, SIG_IGN); /* a vanished peer is an error to report, not a reason to die */
	alarm(APP_ALARM_S);
}

/* Hints every program starts from: an RDM endpoint of the requested provider, the memory
 * registration modes a portable application supports, FI_CONTEXT operation contexts. */
static inline struct fi_info *app_hints(struct app *a, uint64_t caps)
{
	if (a->hints)
		fi_freeinfo(a->hints);
	a->hints = fi_allocinfo();
	if (!a->hints)
		die(a, "fi_allocinfo failed");
	a->hints->ep_attr->type = FI_EP_RDM;
	a->hints->caps = caps;
	a->hints->mode = FI_CONTEXT;
	a->hints->domain_attr->mr_mode =
	        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	a->hints->fabric_attr->prov_name = strdup(a->prov);
	return a->hints;
}

/* shm, and shm under a layered provider ("shm;ofi_compcntr"): no IP address */
static inline int app_is_ip(const struct app *a)
{
	return strncmp(a->prov, "shm", 3) != 0 || (a->prov[3] != '\0' && a->prov[3] != ';');
}

/* fi_getinfo with the current hints; returns its result (0 or -FI_E*) so a program can report
 * a missing capability instead of failing. */
static inline int app_getinfo(struct app *a)
{
	if (a->info) {
		fi_freeinfo(a->info);
		a->info = NULL;
	}
	int ip = app_is_ip(a);
	return fi_getinfo(FI_VERSION(1, 17), ip ? "127.0.0.1" : NULL, NULL, ip ? FI_SOURCE : 0,
	                  a->hints, &a->info);
}

/* Fabric, domain and address vector of a->info. */
static inline void app_open(struct app *a)
{
	CHECK(a, fi_fabric(a->info->fabric_attr, &a->fabric, NULL));
	app_own(a, &a->fabric->fid);
	CHECK(a, fi_domain(a->fabric, a->info, &a->domain, NULL));
	app_own(a, &a->domain->fid);
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	CHECK(a, fi_av_open(a->domain, &av_attr, &a->av, NULL));
	app_own(a, &a->av->fid);
}

/* fi_cntr_open, counted; returns the result for programs that report refusals. */
static inline int app_cntr_try(struct app *a, enum fi_wait_obj wait, struct fid_cntr **c)
{
	struct fi_cntr_attr attr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = wait };
	a->cntr_opens++;
	*c = NULL;
	int ret = fi_cntr_open(a->domain, &attr, c, NULL);
	if (!ret) {
		app_own(a, &(*c)->fid);
		if (a->npump_cntr < APP_MAX_FIDS)
			a->pump_cntr[a->npump_cntr++] = *c;
	}
	return ret;
}

static inline struct fid_cntr *app_cntr(struct app *a, enum fi_wait_obj wait, const char *what)
{
	struct fid_cntr *c;
	int ret = app_cntr_try(a, wait, &c);
	if (ret)
		die(a, "fi_cntr_open(%s) = %s", what, errstr(ret));
	return c;
}

static inline struct fid_cq *app_cq(struct app *a, enum fi_wait_obj wait)
{
	struct fi_cq_attr attr = { .format = FI_CQ_FORMAT_DATA, .size = 256, .wait_obj = wait };
	struct fid_cq *cq;
	CHECK(a, fi_cq_open(a->domain, &attr, &cq, NULL));
	app_own(a, &cq->fid);
	if (a->npump_cq < APP_MAX_FIDS)
		a->pump_cq[a->npump_cq++] = cq;
	return cq;
}

static inline void app_endpoint(struct app *a)
{
	CHECK(a, fi_endpoint(a->domain, a->info, &a->ep, NULL));
	app_own(a, &a->ep->fid);
	CHECK(a, fi_ep_bind(a->ep, &a->av->fid, 0));
}

static inline void app_bind(struct app *a, struct fid *f, uint64_t flags, const char *what)
{
	int ret = fi_ep_bind(a->ep, f, flags);
	if (ret)
		die(a, "fi_ep_bind(ep, %s) = %s", what, errstr(ret));
}

/* Enables the endpoint and exchanges names with the peer process; a->peer is then usable. */
static inline void app_connect(struct app *a)
{
	CHECK(a, fi_enable(a->ep));
	char name[256];
	size_t len = sizeof name;
	CHECK(a, fi_getname(&a->ep->fid, name, &len));
	uint64_t l = len;
	oob_send_u64(a, l);
	oob_send(a, name, len);
	char peer[256];
	uint64_t pl = oob_recv_u64(a);
	if (pl > sizeof peer)
		die(a, "peer name of %llu bytes", (unsigned long long)pl);
	oob_recv(a, peer, (size_t)pl);
	int n = fi_av_insert(a->av, peer, 1, &a->peer, 0, NULL);
	if (n != 1)
		die(a, "fi_av_insert(peer) = %d", n);
}

/* A registered buffer (registration is always made; desc is what operations take). */
struct app_buf {
	char *p;
	size_t len;
	struct fid_mr *mr;
	void *desc;
	uint64_t key;
};

static inline void app_mr(struct app *a, struct app_buf *b, size_t len, uint64_t access)
{
	if (posix_memalign((void **)&b->p, 4096, len))
		die(a, "posix_memalign(%zu) failed", len);
	memset(b->p, 0, len);
	b->len = len;
	static uint64_t requested_key = 1; /* used only by providers without FI_MR_PROV_KEY */
	CHECK(a, fi_mr_reg(a->domain, b->p, len, access, 0, requested_key++, 0, &b->mr, NULL));
	app_own(a, &b->mr->fid);
	b->desc = fi_mr_desc(b->mr);
	b->key = fi_mr_key(b->mr);
}

/* Remote address of offset `off` in the peer's buffer at `base` (virtual or offset-based). */
static inline uint64_t app_raddr(const struct app *a, uint64_t base, uint64_t off)
{
	return ((a->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? base : 0) + off;
}

/* ---- the end ----------------------------------------------------------------------------- */

/* Closes everything (reverse order of opening), prints "fi_cntr_open calls", and hands the
 * output over: the client sends its lines to the server and exits; the server prints its
 * lines, then the client's, and exits with the worse of the two statuses. Never returns. */
static inline void app_finish(struct app *a, int status)
{
	static int finishing;
	if (!finishing) {
		finishing = 1;
		for (int i = a->nowned - 1; i >= 0; i--) {
			int ret = fi_close(a->owned[i]);
			if (ret) {
				out(a, "FAILED: fi_close(object %d of %d, class %d) = %s", i + 1,
				    a->nowned, (int)a->owned[i]->fclass, errstr(ret));
				status = 1;
			}
		}
		a->nowned = 0;
		if (a->info)
			fi_freeinfo(a->info);
		if (a->hints)
			fi_freeinfo(a->hints);
		a->info = a->hints = NULL;
	}
	out(a, "fi_cntr_open calls: %d", a->cntr_opens);
	if (a->role == ROLE_CLIENT) {
		/* one write below the pipe's capacity: never blocks, arrives whole */
		uint64_t st = (uint64_t)status;
		char msg[sizeof st + APP_OUT_MAX];
		memcpy(msg, &st, sizeof st);
		memcpy(msg + sizeof st, a->out, a->outlen);
		if (write(a->report, msg, sizeof st + a->outlen) < 0)
			status = 1; /* the server reports the missing report */
		close(a->report);
		close(a->sock);
		exit(status); /* exit, not _exit: libfabric's and any hook's destructors run */
	}
	/* server: collect the client's report. If we failed, the client may be waiting for us:
	 * closing our end of the channel makes its next out-of-band step fail, and it is stopped
	 * if it has not reported once its own longest wait has passed. */
	if (status)
		shutdown(a->sock, SHUT_RDWR);
	static char rep[sizeof(uint64_t) + APP_OUT_MAX];
	size_t replen = 0;
	const int64_t deadline = now_ms() + APP_WAIT_MS + 2000;
	for (;;) {
		struct pollfd pfd = { .fd = a->report, .events = POLLIN };
		int64_t left = deadline - now_ms();
		if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
			break;
		ssize_t n = read(a->report, rep + replen, sizeof rep - replen);
		if (n <= 0)
			break; /* EOF: the client has exited */
		replen += (size_t)n;
	}
	int wst = 0;
	if (replen < sizeof(uint64_t))
		kill(a->child, SIGKILL);
	if (waitpid(a->child, &wst, 0) < 0)
		wst = -1;
	fwrite(a->out, 1, a->outlen, stdout);
	uint64_t cst = 1;
	if (replen >= sizeof cst) {
		memcpy(&cst, rep, sizeof cst);
		fwrite(rep + sizeof cst, 1, replen - sizeof cst, stdout);
	} else {
		printf("client: FAILED: no report from the client process\n");
	}
	if (wst == -1 || !WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
		if (wst != -1 && WIFSIGNALED(wst))
			printf("client: FAILED: ended by signal %d\n", WTERMSIG(wst));
		else if (cst == 0)
			printf("client: FAILED: exit status %d\n",
			       wst != -1 && WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
		status = 1;
	}
	if (cst != 0)
		status = 1;
	fflush(stdout);
	exit(status);
}

#endif
