/* version.h — grpod's version: `grpod --version`, GET /version. */
#ifndef GRPOD_VERSION_H
#define GRPOD_VERSION_H
#define GRPOD_VERSION "0.1.0"
#endif
