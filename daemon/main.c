/* main.c — grpod's one binary: subcommands (placeholder until the CLI lands). */
#include <stdio.h>
int main(void) { puts("grpod"); return 0; }
