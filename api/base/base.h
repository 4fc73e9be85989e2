/* base: the base room's door (api/base/: what kiln-api's resource rooms
 * share below them: the configuration file, api_config.c; the pure parsers
 * of request bodies, request.c; customers' S3 destinations, destination.c;
 * presigned URLs, presign.c). It may call the store room and lib/. Other
 * rooms include this header only. */
#ifndef KILN_API_BASE_H
#define KILN_API_BASE_H

#include "api_config.h"
#include "destination.h"
#include "presign.h"
#include "request.h"

#endif
