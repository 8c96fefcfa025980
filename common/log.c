/* log.c — JSON-lines events on stderr; see log.h. */
#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "common/err.h"

static _Atomic int cur_level = LOG_INFO;
static const char *const level_names[] = {"debug", "info", "warn", "error"};

int log_parse_level(const char *s, log_level *out) {
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, level_names[i]) == 0) {
            *out = (log_level)i;
            return 0;
        }
    return err_set(GE_INVALID, "log level '%s' is not debug|info|warn|error", s ? s : "");
}
void log_set_level(log_level l) { atomic_store(&cur_level, (int)l); }
log_level log_get_level(void) { return (log_level)atomic_load(&cur_level); }

const char *log_str(char *buf, int buflen, const char *s) {
    int o = 0;
    if (buflen < 8) {
        buf[0] = 0;
        return buf;
    }
    buf[o++] = '"';
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p && o < buflen - 8; p++) {
        if (*p == '"' || *p == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)*p;
        } else if (*p == '\n') {
            buf[o++] = '\\';
            buf[o++] = 'n';
        } else if (*p < 0x20) o += snprintf(buf + o, (size_t)(buflen - o), "\\u%04x", *p);
        else buf[o++] = (char)*p;
    }
    buf[o++] = '"';
    buf[o] = 0;
    return buf;
}

void log_event(log_level l, const char *event, const char *fields_fmt, ...) {
    if ((int)l < atomic_load(&cur_level)) return;
    char line[4096];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    int o = snprintf(line, sizeof line, "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\",\"level\":\"%s\",\"event\":\"%s\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
                     level_names[l], event);
    if (fields_fmt && *fields_fmt && o < (int)sizeof line - 4) {
        line[o++] = ',';
        va_list ap;
        va_start(ap, fields_fmt);
        int k = vsnprintf(line + o, sizeof line - (size_t)o - 3, fields_fmt, ap);
        va_end(ap);
        o += k < 0 ? 0 : (k > (int)sizeof line - o - 4 ? (int)sizeof line - o - 4 : k);
    }
    line[o++] = '}';
    line[o++] = '\n';
    line[o] = 0;
    fputs(line, stderr);
}
