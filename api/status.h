/* status.h — the HTTP status of each error code (common/err.h keeps the codes free of HTTP). */
#ifndef GRPOD_API_STATUS_H
#define GRPOD_API_STATUS_H
int api_http_status(int code); /* GE_INVALID → 400, GE_BUSY → 429, …; an unknown code → 500 */
#endif
