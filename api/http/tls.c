/* tls: kiln-api's TLS listener (configuration `tls`: listen, cert_file,
 * key_file; docs/api.md "TLS and the sandbox domain"). libmicrohttpd (built
 * with GnuTLS) speaks TLS with the operator's certificate, typically one for
 * `*.<sandbox_domain>` and the API's own name, on a second listener beside
 * the plain one; both serve the same routes. SIGHUP reads the PEM files
 * again (server_reload): a new daemon starts on the same listening socket
 * (kiln-api's own, a dup for each daemon), the old one is quiesced (it
 * takes no new connection and serves those it has, WebSockets included,
 * until they end), so a renewed certificate takes effect without cutting
 * anyone. One socket, not two bound with SO_REUSEPORT: closing a second
 * socket would reset the connections waiting in its accept queue. A file that does not
 * load leaves the running certificate in place and says why. */
#include "server_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "io.h"

#define TLS_PEM_MAX (1u << 20)

char *tls_read_pem(const char *path, const char *what, struct kiln_err *err)
{
	size_t n = 0;
	char *p = io_read_file(path, TLS_PEM_MAX, &n);

	if (!p || !n) {
		free(p);
		kiln_err_set(err, KERR_CONFIG, "tls.%s: cannot read %s", what, path);
		return NULL;
	}
	if (!strstr(p, "-----BEGIN ")) {
		free(p);
		kiln_err_set(err, KERR_CONFIG, "tls.%s: %s is not PEM", what, path);
		return NULL;
	}
	return p;
}

/* kiln-api's TLS listening socket (nonblocking, close-on-exec); -1 with
 * err set. */
static int tls_listen(const struct api_config *cfg, struct kiln_err *err)
{
	struct sockaddr_in sa;
	int fd;

	if (server_parse_listen(cfg->tls_listen, &sa) < 0) {
		kiln_err_set(err, KERR_CONFIG, "tls.listen: expected IPv4-ADDRESS:PORT (got \"%s\")", cfg->tls_listen);
		return -1;
	}
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &(int){ 1 }, sizeof(int)) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, SOMAXCONN) < 0) {
		kiln_err_set(err, KERR_LISTEN, "tls: cannot listen on %s: %s", cfg->tls_listen, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

static struct MHD_Daemon *tls_daemon(struct server *s, const char *cert, const char *key, struct kiln_err *err)
{
	const struct api_config *cfg = s->cfg;
	struct MHD_Daemon *d;
	int lfd;

	if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
		kiln_err_set(err, KERR_CONFIG, "tls: this libmicrohttpd was built without TLS");
		return NULL;
	}
	lfd = fcntl(s->tls_lfd, F_DUPFD_CLOEXEC, 3);
	if (lfd < 0) {
		kiln_err_set(err, KERR_LISTEN, "tls: %s", strerror(errno));
		return NULL;
	}
	d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
				     MHD_USE_ERROR_LOG | MHD_ALLOW_UPGRADE | MHD_USE_TLS | MHD_USE_ITC,
			     0, NULL, NULL, server_access, s, MHD_OPTION_NOTIFY_COMPLETED,
			     server_completed, NULL, MHD_OPTION_URI_LOG_CALLBACK, server_uri_log, NULL,
			     MHD_OPTION_LISTEN_SOCKET, lfd, MHD_OPTION_CONNECTION_TIMEOUT, cfg->connection_timeout_s,
			     MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
			     cfg->max_connections_per_address,
			     MHD_OPTION_HTTPS_MEM_CERT, cert, MHD_OPTION_HTTPS_MEM_KEY, key, MHD_OPTION_HTTPS_PRIORITIES,
			     HTTPD_TLS_PRIORITIES, MHD_OPTION_END);
	if (!d) {
		close(lfd);
		kiln_err_set(err, KERR_LISTEN, "tls: cannot serve on %s with %s and %s (is the key the certificate's?)",
			     cfg->tls_listen, cfg->tls_cert_file, cfg->tls_key_file);
	}
	return d;
}

int server_tls_start(struct server *s, struct kiln_err *err)
{
	char *cert = tls_read_pem(s->cfg->tls_cert_file, "cert_file", err), *key = NULL;

	pthread_mutex_init(&s->tls_lock, NULL);
	s->tls_lfd = -1;
	if (!cert || !(key = tls_read_pem(s->cfg->tls_key_file, "key_file", err)) ||
	    (s->tls_lfd = tls_listen(s->cfg, err)) < 0 || !(s->tls_d = tls_daemon(s, cert, key, err))) {
		free(cert);
		free(key);
		if (s->tls_lfd >= 0)
			close(s->tls_lfd);
		s->tls_lfd = -1;
		return -1;
	}
	s->tls_cert = cert;
	s->tls_key = key;
	return 0;
}

int server_reload(struct server *s, struct kiln_err *err)
{
	struct MHD_Daemon *d, *old;
	char *cert, *key = NULL;
	MHD_socket lfd;

	if (!s->cfg->tls_listen)
		return 0;
	cert = tls_read_pem(s->cfg->tls_cert_file, "cert_file", err);
	if (!cert || !(key = tls_read_pem(s->cfg->tls_key_file, "key_file", err))) {
		free(cert);
		return -1;
	}
	pthread_mutex_lock(&s->tls_lock);
	d = tls_daemon(s, cert, key, err);
	if (!d) {
		pthread_mutex_unlock(&s->tls_lock);
		free(cert);
		free(key);
		return -1;
	}
	old = s->tls_d;
	s->tls_d = d;
	/* The old daemon keeps its connections and stops accepting; its dup of
	 * the listening socket goes (the socket stays: the new daemon's). */
	lfd = MHD_quiesce_daemon(old);
	if (lfd != MHD_INVALID_SOCKET)
		close(lfd);
	if (s->tls_old[0].d) { /* the oldest of the quiesced: its connections end now */
		MHD_stop_daemon(s->tls_old[0].d);
		free(s->tls_old[0].cert);
		free(s->tls_old[0].key);
	}
	memmove(s->tls_old, s->tls_old + 1, sizeof(s->tls_old) - sizeof(s->tls_old[0]));
	/* Each daemon's PEM text lives as long as it does. */
	s->tls_old[TLS_OLD_MAX - 1] = (struct tls_old){ old, s->tls_cert, s->tls_key };
	s->tls_cert = cert;
	s->tls_key = key;
	pthread_mutex_unlock(&s->tls_lock);
	return 0;
}

void server_tls_stop(struct server *s)
{
	if (!s->cfg->tls_listen || !s->tls_d)
		return;
	for (size_t i = 0; i < TLS_OLD_MAX; i++)
		if (s->tls_old[i].d) {
			MHD_stop_daemon(s->tls_old[i].d);
			free(s->tls_old[i].cert);
			free(s->tls_old[i].key);
		}
	MHD_stop_daemon(s->tls_d);
	close(s->tls_lfd);
	free(s->tls_cert);
	free(s->tls_key);
	pthread_mutex_destroy(&s->tls_lock);
}
