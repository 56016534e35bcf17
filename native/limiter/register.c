/*
 * Registration with the node's hypervisor: `POST /api/v1/process?container_name=..&container_pid=..`
 * with the pod's service-account token as `Authorization: Bearer`, so the hypervisor puts this
 * process's host PID in the pod's PID set at once instead of on its next /proc scan.
 *
 * Done once, when the limits are loaded (the first CUDA call), on a detached thread that blocks
 * every signal, so the host program is never held up and its signal handlers never run here. Each
 * step has a bound (connect, send, every receive: REGISTER_TIMEOUT_S). Plain HTTP/1.1 over a socket,
 * `Connection: close`. Without HYPERVISOR_IP (not a pod the webhook wired) nothing is attempted;
 * any failure is one line on stderr and changes nothing else: the hypervisor still finds the PID
 * through /proc.
 *
 * Environment: HYPERVISOR_IP, HYPERVISOR_PORT (default 8001), CONTAINER_NAME, and
 * TF_LIMITER_TOKEN_PATH (default: the service-account token every pod has mounted).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "limiter.h"

#define REGISTER_TIMEOUT_S 2
#define DEFAULT_PORT "8001"
#define DEFAULT_TOKEN_PATH "/var/run/secrets/kubernetes.io/serviceaccount/token"
#define TOKEN_MAX 8192
#define RESPONSE_MAX 4096

struct registration {
    char host[256];
    char port[16];
    char container[254];
    char token[TOKEN_MAX];
    int pid;
};

static struct registration pending;

static int copy_env(char *out, size_t size, const char *name, const char *fallback) {
    const char *value = getenv(name);
    if (!value || !*value)
        value = fallback;
    if (!value || strlen(value) >= size)
        return 0;
    strcpy(out, value);
    return 1;
}

/* the token file's text without trailing whitespace; NULL or a reason on failure */
static const char *read_token(char *out, size_t size) {
    static char why[320];
    const char *path = getenv("TF_LIMITER_TOKEN_PATH");
    if (!path || !*path)
        path = DEFAULT_TOKEN_PATH;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, sizeof why, "cannot read the pod's token %s: %s", path, strerror(errno));
        return why;
    }
    size_t length = 0;
    ssize_t got;
    while (length < size - 1 && (got = read(fd, out + length, size - 1 - length)) > 0)
        length += (size_t)got;
    close(fd);
    while (length > 0 && (out[length - 1] == '\n' || out[length - 1] == '\r' || out[length - 1] == ' '))
        length--;
    out[length] = '\0';
    if (length == 0) {
        snprintf(why, sizeof why, "the pod's token %s is empty or unreadable", path);
        return why;
    }
    return NULL;
}

/* a connected socket within the timeout, or -1 with errno set */
static int connect_bounded(const struct addrinfo *address) {
    int fd = socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    address->ai_protocol);
    if (fd < 0)
        return -1;
    if (connect(fd, address->ai_addr, address->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) {
            int saved = errno;
            close(fd);
            errno = saved;
            return -1;
        }
        struct pollfd waiting = {.fd = fd, .events = POLLOUT};
        int ready = poll(&waiting, 1, REGISTER_TIMEOUT_S * 1000);
        int problem = 0;
        socklen_t problem_size = sizeof problem;
        if (ready == 0)
            problem = ETIMEDOUT;
        else if (ready < 0)
            problem = errno;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &problem, &problem_size) != 0)
            problem = errno;
        if (problem) {
            close(fd);
            errno = problem;
            return -1;
        }
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    struct timeval bound = {.tv_sec = REGISTER_TIMEOUT_S, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof bound);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
    return fd;
}

static int open_connection(const struct registration *to, char *why, size_t why_size) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *addresses = NULL;
    int status = getaddrinfo(to->host, to->port, &hints, &addresses);
    if (status != 0) {
        snprintf(why, why_size, "cannot resolve HYPERVISOR_IP=%s: %s", to->host, gai_strerror(status));
        return -1;
    }
    int fd = -1, problem = 0;
    for (struct addrinfo *address = addresses; address && fd < 0; address = address->ai_next) {
        fd = connect_bounded(address);
        if (fd < 0)
            problem = errno;
    }
    freeaddrinfo(addresses);
    if (fd < 0)
        snprintf(why, why_size, "cannot reach the hypervisor at %s:%s: %s", to->host, to->port,
                 strerror(problem));
    return fd;
}

static int send_all(int fd, const char *data, size_t length) {
    while (length > 0) {
        ssize_t sent = send(fd, data, length, MSG_NOSIGNAL);
        if (sent <= 0)
            return 0;
        data += sent;
        length -= (size_t)sent;
    }
    return 1;
}

static double monotonic_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/* the response's first RESPONSE_MAX - 1 bytes, until the server closes (or, for a server that
 * trickles bytes, until 2 x REGISTER_TIMEOUT_S have passed); its length or -1 */
static ssize_t receive_response(int fd, char *out, size_t size) {
    size_t length = 0;
    double give_up = monotonic_s() + 2.0 * REGISTER_TIMEOUT_S;
    while (length < size - 1 && monotonic_s() < give_up) {
        ssize_t got = recv(fd, out + length, size - 1 - length, 0);
        if (got == 0)
            break;
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        length += (size_t)got;
    }
    out[length] = '\0';
    return (ssize_t)length;
}

/* container names are DNS labels; anything else is percent-encoded all the same */
static void query_escape(const char *text, char *out, size_t size) {
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (; *text && n + 4 < size; text++) {
        unsigned char c = (unsigned char)*text;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
            c == '.' || c == '_' || c == '~') {
            out[n++] = (char)c;
        } else {
            out[n++] = '%';
            out[n++] = hex[c >> 4];
            out[n++] = hex[c & 15];
        }
    }
    out[n] = '\0';
}

/* the value of "message" in the answer, for the line on stderr */
static void answer_message(const char *body, char *out, size_t size) {
    const char *start = strstr(body, "\"message\":\"");
    if (!start)
        start = strstr(body, "\"error\":\"");
    if (!start) {
        snprintf(out, size, "%.200s", body);
        return;
    }
    start = strchr(start, ':') + 2;
    size_t n = 0;
    for (; start[n] && start[n] != '"' && n + 1 < size; n++)
        out[n] = start[n];
    out[n] = '\0';
}

static void report(const struct registration *to, const char *response) {
    int status = 0;
    if (sscanf(response, "HTTP/1.%*d %d", &status) != 1) {
        tf_say("POST /api/v1/process to %s:%s got no HTTP answer: process %d is not registered "
               "(the hypervisor still finds it through /proc)", to->host, to->port, to->pid);
        return;
    }
    const char *body = strstr(response, "\r\n\r\n");
    body = body ? body + 4 : "";
    if (status == 200 && strstr(body, "\"success\":true"))
        return;
    char message[240];
    answer_message(body, message, sizeof message);
    tf_say("POST /api/v1/process to %s:%s answered %d: %s: process %d is not registered "
           "(the hypervisor still finds it through /proc)", to->host, to->port, status, message, to->pid);
}

static void *register_process(void *unused) {
    (void)unused;
    const struct registration *to = &pending;
    char why[400];
    int fd = open_connection(to, why, sizeof why);
    if (fd < 0) {
        tf_say("%s: process %d is not registered (the hypervisor still finds it through /proc)", why, to->pid);
        return NULL;
    }
    char container[3 * sizeof to->container];
    query_escape(to->container, container, sizeof container);
    int ipv6 = strchr(to->host, ':') != NULL; /* a literal IPv6 address is bracketed in Host */
    static char request[TOKEN_MAX + 1024];
    int length = snprintf(request, sizeof request,
                          "POST /api/v1/process?container_name=%s&container_pid=%d HTTP/1.1\r\n"
                          "Host: %s%s%s:%s\r\nAuthorization: Bearer %s\r\nContent-Length: 0\r\n"
                          "Connection: close\r\nUser-Agent: tfusion-limiter\r\n\r\n",
                          container, to->pid, ipv6 ? "[" : "", to->host, ipv6 ? "]" : "", to->port, to->token);
    static char response[RESPONSE_MAX];
    if (length < 0 || (size_t)length >= sizeof request || !send_all(fd, request, (size_t)length)) {
        tf_say("cannot send to the hypervisor at %s:%s: %s: process %d is not registered "
               "(the hypervisor still finds it through /proc)", to->host, to->port, strerror(errno), to->pid);
    } else if (receive_response(fd, response, sizeof response) < 0) {
        tf_say("no answer from the hypervisor at %s:%s within %d s: %s: process %d is not registered "
               "(the hypervisor still finds it through /proc)", to->host, to->port, REGISTER_TIMEOUT_S,
               strerror(errno), to->pid);
    } else {
        report(to, response);
    }
    close(fd);
    return NULL;
}

void tf_register_with_hypervisor(void) {
    if (!getenv("HYPERVISOR_IP") || !*getenv("HYPERVISOR_IP"))
        return; /* not a pod the webhook wired: nothing to register with */
    struct registration *to = &pending;
    to->pid = (int)getpid();
    if (!copy_env(to->host, sizeof to->host, "HYPERVISOR_IP", NULL) ||
        !copy_env(to->port, sizeof to->port, "HYPERVISOR_PORT", DEFAULT_PORT) ||
        !copy_env(to->container, sizeof to->container, "CONTAINER_NAME", NULL)) {
        tf_say("HYPERVISOR_IP, HYPERVISOR_PORT or CONTAINER_NAME is missing or too long: process %d is not "
               "registered (the hypervisor still finds it through /proc)", to->pid);
        return;
    }
    const char *why = read_token(to->token, sizeof to->token);
    if (why) {
        tf_say("%s: process %d is not registered (the hypervisor still finds it through /proc)", why, to->pid);
        return;
    }
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int failed = pthread_create(&thread, &attributes, register_process, NULL);
    pthread_attr_destroy(&attributes);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (failed)
        tf_say("cannot start the registration thread: %s: process %d is not registered", strerror(failed), to->pid);
}
