/* The pod sandbox's pause process (containerd's sandbox_image, built here because no registry is
 * reachable): it holds the pod's namespaces open, reaps the zombies of a shared PID namespace, and
 * exits 0 on SIGINT or SIGTERM. Linked statically so that the image is this one file. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
  (void)sig;
  _exit(0);
}

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
    printf("tandem pause 1.0\n");
    return 0;
  }
  if (getpid() != 1) {
    fprintf(stderr, "pause: warning: not running as PID 1\n");
  }
  struct sigaction stop_action = {.sa_handler = stop};
  struct sigaction reap_action = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop_action, NULL) < 0 || sigaction(SIGTERM, &stop_action, NULL) < 0 ||
      sigaction(SIGCHLD, &reap_action, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
