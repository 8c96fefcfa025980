/* log.h — grpod's structured log: one JSON object per event on stderr (JSON lines):
 *   {"ts":"2024-05-01T12:00:00.123Z","level":"info","event":"job_done","id":"j_..","ms":12.5}
 * Fields are given as a printf format of already-JSON key/value pairs, built with log_str()
 * for strings that need escaping. Safe from any thread (one fputs of one whole line). */
#ifndef GRPOD_LOG_H
#define GRPOD_LOG_H

typedef enum { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR } log_level;

int log_parse_level(const char *s, log_level *out); /* "debug".."error"; 0 or GE_INVALID */
void log_set_level(log_level l);
log_level log_get_level(void);

/* log_event(LOG_INFO, "job_done", "\"id\":\"%s\",\"ms\":%.1f", id, ms); fields may be NULL. */
void log_event(log_level l, const char *event, const char *fields_fmt, ...) __attribute__((format(printf, 3, 4)));

/* JSON-escape s into buf (quotes included) and return buf: for "\"msg\":%s". */
const char *log_str(char *buf, int buflen, const char *s);
#endif
