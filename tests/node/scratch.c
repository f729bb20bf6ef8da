/* The node tests' workload: one static binary, the only file of a FROM-scratch image.
 *   scratch hello N         print N numbered lines (what `kubectl logs` must return), then idle
 *   scratch resolve NAME [PORT]
 *                           resolve NAME through the pod's DNS until it answers and print the
 *                           address; with PORT also open a TCP connection to it; then idle
 *   scratch touch PATH      create PATH (a volume's write permission), then idle
 * Idles until SIGTERM so that the pod stays Running and stops at once when deleted. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void idle(void) {
    sigset_t set;
    int sig;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    sigwait(&set, &sig);
}

static int resolve(const char *name, const char *port) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    char ip[INET_ADDRSTRLEN];
    for (;;) {
        int err = getaddrinfo(name, NULL, &hints, &res);
        if (err == 0) break;
        printf("resolve %s: %s\n", name, gai_strerror(err));
        fflush(stdout);
        sleep(1);
    }
    inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, sizeof ip);
    printf("resolved %s %s\n", name, ip);
    if (port) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        ((struct sockaddr_in *)res->ai_addr)->sin_port = htons(atoi(port));
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) printf("connected %s:%s\n", ip, port);
        else printf("connect %s:%s: %s\n", ip, port, strerror(errno));
        close(fd);
    }
    freeaddrinfo(res);
    return 0;
}

int main(int argc, char **argv) {
    char host[256] = "?";
    gethostname(host, sizeof host);
    if (argc == 3 && strcmp(argv[1], "hello") == 0) {
        for (int i = 1; i <= atoi(argv[2]); i++) printf("hello %d from %s\n", i, host);
    } else if ((argc == 3 || argc == 4) && strcmp(argv[1], "resolve") == 0) {
        resolve(argv[2], argc == 4 ? argv[3] : NULL);
    } else if (argc == 3 && strcmp(argv[1], "touch") == 0) {
        int fd = open(argv[2], O_CREAT | O_WRONLY, 0644);
        if (fd < 0) printf("touch %s: %s\n", argv[2], strerror(errno));
        else printf("wrote %s\n", argv[2]);
    } else {
        fprintf(stderr, "usage: scratch hello N | resolve NAME [PORT] | touch PATH\n");
        return 2;
    }
    fflush(stdout);
    idle();
    return 0;
}
