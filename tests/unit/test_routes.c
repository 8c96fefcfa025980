/* test_routes.c — the rows of the route table (api/routes.h) keep the promises the router and
 * the OpenAPI document make from them: one row per method and path; the key guards exactly the
 * /v1 paths (what the document's description and security say); a body that may be empty is a
 * body; 202 rows answer the Accepted schema; query parameters are JSON the document can take. */
#include <json-c/json.h>

#include "api/routes.h"
#include "tests/unit/check.h"

TEST(test_routes_one_row_per_method_and_path) {
    CHECK(api_n_routes > 0);
    for (int i = 0; i < api_n_routes; i++) {
        const api_route *r = &api_routes[i];
        CHECK_MSG(!strcmp(r->method, "GET") || !strcmp(r->method, "POST") || !strcmp(r->method, "DELETE"), "row %d: method %s", i,
                  r->method);
        CHECK_MSG(r->path[0] == '/' && r->handler && r->doc.summary && r->doc.summary[0], "row %d (%s)", i, r->path);
        for (int k = 0; k < i; k++)
            CHECK_MSG(strcmp(api_routes[k].method, r->method) || strcmp(api_routes[k].path, r->path),
                      "%s %s has rows %d and %d: the second is never served", r->method, r->path, k, i);
    }
}

TEST(test_routes_key_guards_v1) {
    for (int i = 0; i < api_n_routes; i++) {
        const api_route *r = &api_routes[i];
        CHECK_MSG((r->auth == API_KEY) == !strncmp(r->path, "/v1/", 4), "%s %s: auth %d", r->method, r->path, r->auth);
    }
}

TEST(test_routes_docs) {
    for (int i = 0; i < api_n_routes; i++) {
        const api_doc *d = &api_routes[i].doc;
        const char *p = api_routes[i].path;
        CHECK_MSG(!d->body_optional || d->body, "%s: an optional body without a schema", p);
        CHECK_MSG(d->ok == 0 || d->ok == 200 || d->ok == 202, "%s: ok %d", p, d->ok);
        CHECK_MSG(d->ok != 202 || (d->ok_body && !strcmp(d->ok_body, "Accepted")), "%s: 202 without Accepted", p);
        if (!d->query) continue;
        json_object *q = json_tokener_parse(d->query);
        int ok = q && json_object_is_type(q, json_type_array) && json_object_array_length(q) > 0;
        for (size_t k = 0; ok && k < json_object_array_length(q); k++) {
            json_object *e = json_object_array_get_idx(q, k), *in;
            ok = json_object_object_get_ex(e, "name", NULL) && json_object_object_get_ex(e, "in", &in) &&
                !strcmp(json_object_get_string(in), "query");
        }
        json_object_put(q);
        CHECK_MSG(ok, "%s: query is not an array of query parameters: %s", p, d->query);
    }
}

int main(void) {
    RUN(test_routes_one_row_per_method_and_path);
    RUN(test_routes_key_guards_v1);
    RUN(test_routes_docs);
    return CHECK_DONE();
}
