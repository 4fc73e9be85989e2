/* test_s3: unit tests for lib/s3.c that need no server: object key and query
 * encoding, presigned URLs against known answers, configuration and key
 * checks, and the XML text extractor on S3's replies and on hostile input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3.h"

/* ---- key encoding ----------------------------------------------------------- */

static void expect_key(const char *key, const char *want)
{
	char *got = s3_encode_key(key);

	assert_non_null(got);
	assert_string_equal(got, want);
	free(got);
}

static void test_encode_key(void **state)
{
	expect_key("a/b/c.txt", "a/b/c.txt");
	expect_key("cust-1/task_2/out~v1.tar.gz", "cust-1/task_2/out~v1.tar.gz");
	expect_key("dir/sp ace+plus:colon", "dir/sp%20ace%2Bplus%3Acolon");
	expect_key("q?h#p%&=", "q%3Fh%23p%25%26%3D");
	expect_key("\xc3\xa9t\xc3\xa9", "%C3%A9t%C3%A9"); /* UTF-8 bytes, uppercase hex */
	expect_key("", "");
}

/* Every byte 1..255: the output holds only unreserved characters, '/' and
 * uppercase %XX escapes, and decodes back to the input. */
static void test_encode_key_all_bytes(void **state)
{
	char in[256], dec[256];
	char *out;
	size_t i, o = 0;

	for (i = 0; i < 255; i++)
		in[i] = (char)(i + 1);
	in[255] = '\0';
	out = s3_encode_key(in);
	assert_non_null(out);
	for (i = 0; out[i]; i++) {
		unsigned char ch = (unsigned char)out[i];

		if (ch == '%') {
			unsigned v;

			assert_true(isxdigit((unsigned char)out[i + 1]) && isxdigit((unsigned char)out[i + 2]));
			assert_false(islower((unsigned char)out[i + 1]) || islower((unsigned char)out[i + 2]));
			assert_int_equal(sscanf(out + i + 1, "%2x", &v), 1);
			dec[o++] = (char)v;
			i += 2;
		} else {
			assert_true(isalnum(ch) || strchr("-_.~/", ch));
			dec[o++] = (char)ch;
		}
	}
	dec[o] = '\0';
	assert_string_equal(dec, in);
	free(out);
}

/* ---- query canonicalisation -------------------------------------------------- */

static void expect_query(const struct s3_param *p, size_t n, const char *want)
{
	char *got = s3_canonical_query(p, n);

	assert_non_null(got);
	assert_string_equal(got, want);
	free(got);
}

static void test_canonical_query(void **state)
{
	const struct s3_param uploads[] = { { "uploads", "" } };
	const struct s3_param null_value[] = { { "uploads", NULL } };
	/* UploadPart as libcurl must send it: sorted, values encoded. */
	const struct s3_param part[] = { { "uploadId", "2~a/b+c=d e" }, { "partNumber", "12" } };
	const struct s3_param list[] = { { "prefix", "cust/task/" }, { "list-type", "2" }, { "delimiter", "/" } };
	/* Byte order: uppercase before lowercase, and equal names by value. */
	const struct s3_param order[] = { { "b", "2" }, { "a", "z" }, { "B", "1" }, { "a", "y" } };

	expect_query(uploads, 1, "uploads=");
	expect_query(null_value, 1, "uploads=");
	expect_query(part, 2, "partNumber=12&uploadId=2~a%2Fb%2Bc%3Dd%20e");
	expect_query(list, 3, "delimiter=%2F&list-type=2&prefix=cust%2Ftask%2F");
	expect_query(order, 4, "B=1&a=y&a=z&b=2");
	expect_query(NULL, 0, "");
}

static void test_canonical_query_limit(void **state)
{
	struct s3_param p[65];
	size_t i;

	for (i = 0; i < 65; i++)
		p[i] = (struct s3_param){ "x", "y" };
	assert_null(s3_canonical_query(p, 65));
}

/* ---- presigned URLs ------------------------------------------------------------- */

/* The example of AWS's "Authenticating Requests: Using Query Parameters (AWS
 * Signature Version 4)" page (Amazon S3 API Reference): GET test.txt in
 * examplebucket (virtual-hosted style), us-east-1, 2013-05-24T00:00:00Z,
 * 86400 s, the documented example keys; the page publishes this URL. */
static void test_presign_aws_example(void **state)
{
	const struct s3_config c = {
		.endpoint = "https://examplebucket.s3.amazonaws.com",
		.region = "us-east-1",
		.bucket = "", /* the endpoint names the bucket */
		.access_key = "AKIAIOSFODNN7EXAMPLE",
		.secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
	};
	struct kiln_err err = { .code = "" };
	char *url = s3_presign_get(&c, "test.txt", 86400, 1369353600, &err);

	if (!url)
		fail_msg("s3_presign_get: %s: %s", err.code, err.message);
	assert_string_equal(url, "https://examplebucket.s3.amazonaws.com/test.txt"
				 "?X-Amz-Algorithm=AWS4-HMAC-SHA256"
				 "&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request"
				 "&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host"
				 "&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404");
	free(url);
}

/* Path-style, a port in the Host, a key that needs encoding and an access key
 * with a colon (Swift's). Expected value derived once with an independent
 * SigV4 implementation written from the AWS spec in Python (hashlib/hmac,
 * urllib.parse.quote with safe "-_.~" and "/" for the path), then hard-coded;
 * the same script reproduces the AWS example above. Swift accepts such URLs
 * (tests/integration/50-s3.sh fetches one with curl). */
static void test_presign_path_style(void **state)
{
	struct s3_config c = {
		.endpoint = "http://127.0.0.1:8780/", /* trailing slash ignored */
		.region = "us-east-1",
		.bucket = "kilntest",
		.access_key = "test:tester",
		.secret_key = "testing",
	};
	struct kiln_err err = { .code = "" };
	char *url = s3_presign_get(&c, "dir/sp ace+plus~t:c/\xc3\xa9", 300, 1700000000, &err);

	if (!url)
		fail_msg("s3_presign_get: %s: %s", err.code, err.message);
	assert_string_equal(url, "http://127.0.0.1:8780/kilntest/dir/sp%20ace%2Bplus~t%3Ac/%C3%A9"
				 "?X-Amz-Algorithm=AWS4-HMAC-SHA256"
				 "&X-Amz-Credential=test%3Atester%2F20231114%2Fus-east-1%2Fs3%2Faws4_request"
				 "&X-Amz-Date=20231114T221320Z&X-Amz-Expires=300&X-Amz-SignedHeaders=host"
				 "&X-Amz-Signature=580786892a70dfe4fa95ba7108a648a3b8da3cb4e15c205210f4d0ac4ef2a538");
	free(url);
}

static const char *signature_of(const char *url)
{
	const char *s = strstr(url, "X-Amz-Signature=");

	assert_non_null(s);
	return s + 16;
}

/* A default port is not part of the Host header curl sends, so it must not be
 * signed; any other port is. The host is signed in lowercase. */
static void test_presign_host(void **state)
{
	struct s3_config c = { .region = "us-east-1", .bucket = "bkt", .access_key = "a", .secret_key = "s" };
	struct kiln_err err;
	char *plain, *with80, *with81, *upper, *https443, *https;

	c.endpoint = "http://s3.example";
	plain = s3_presign_get(&c, "k", 60, 1700000000, &err);
	c.endpoint = "http://s3.example:80";
	with80 = s3_presign_get(&c, "k", 60, 1700000000, &err);
	c.endpoint = "http://s3.example:81";
	with81 = s3_presign_get(&c, "k", 60, 1700000000, &err);
	c.endpoint = "http://S3.Example";
	upper = s3_presign_get(&c, "k", 60, 1700000000, &err);
	c.endpoint = "https://s3.example:443";
	https443 = s3_presign_get(&c, "k", 60, 1700000000, &err);
	c.endpoint = "https://s3.example";
	https = s3_presign_get(&c, "k", 60, 1700000000, &err);
	assert_true(plain && with80 && with81 && upper && https443 && https);
	assert_string_equal(signature_of(plain), signature_of(with80));
	assert_string_equal(signature_of(plain), signature_of(upper));
	assert_string_not_equal(signature_of(plain), signature_of(with81));
	assert_string_equal(signature_of(https), signature_of(https443));
	assert_true(strncmp(with81, "http://s3.example:81/bkt/k?", 27) == 0);
	free(plain);
	free(with80);
	free(with81);
	free(upper);
	free(https443);
	free(https);
}

static void expect_presign_error(const struct s3_config *c, const char *key, unsigned expires, const char *needle)
{
	struct kiln_err err = { .code = "" };
	char *url = s3_presign_get(c, key, expires, 1700000000, &err);

	if (url)
		fail_msg("s3_presign_get(%s, %u) accepted: %s", key ? key : "(null)", expires, url);
	assert_string_equal(err.code, "s3_error");
	if (!strstr(err.message, needle))
		fail_msg("message \"%s\" lacks \"%s\"", err.message, needle);
}

static void test_presign_rejects(void **state)
{
	const struct s3_config ok = { .endpoint = "http://127.0.0.1:8780", .region = "us-east-1",
				      .bucket = "kilntest", .access_key = "a", .secret_key = "s" };
	struct s3_config c = ok;
	char long_key[1100];

	expect_presign_error(&c, "k", 0, "lifetime");
	expect_presign_error(&c, "k", 604801, "lifetime");
	expect_presign_error(&c, "", 60, "empty");
	expect_presign_error(&c, NULL, 60, "empty");
	expect_presign_error(&c, "a/../b", 60, "segment");
	expect_presign_error(&c, "./b", 60, "segment");
	expect_presign_error(&c, "a//b", 60, "segment");
	expect_presign_error(&c, "/a", 60, "segment");
	expect_presign_error(&c, "a/", 60, "segment");
	expect_presign_error(&c, "a\nb", 60, "control character");
	memset(long_key, 'k', sizeof(long_key) - 1);
	long_key[sizeof(long_key) - 1] = '\0';
	expect_presign_error(&c, long_key, 60, "longer than");
	c.endpoint = "ftp://x";
	expect_presign_error(&c, "k", 60, "not an http");
	c.endpoint = "http://user@host";
	expect_presign_error(&c, "k", 60, "scheme://host");
	c = ok;
	c.bucket = "Bad_Bucket";
	expect_presign_error(&c, "k", 60, "bucket");
	c = ok;
	c.region = "us east";
	expect_presign_error(&c, "k", 60, "region");
	c = ok;
	c.secret_key = NULL;
	expect_presign_error(&c, "k", 60, "incomplete");
	c = ok;
	c.part_size = 1 << 20;
	expect_presign_error(&c, "k", 60, "5 MiB");
	/* Dots inside a segment are fine. */
	{
		struct kiln_err err;
		char *u = s3_presign_get(&ok, "a/..b/.c./d.", 60, 1700000000, &err);

		assert_non_null(u);
		free(u);
	}
}

static int printable_ascii(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			return 0;
	return 1;
}

/* Refusals happen before any request (the endpoint is a closed port that
 * would give s3_unavailable), and messages show keys as printable ASCII only,
 * even when the key holds control or non-ASCII bytes or is very long. */
static void test_refusals_before_network(void **state)
{
	const struct s3_config c = { .endpoint = "http://127.0.0.1:1", .region = "us-east-1", .bucket = "kilntest",
				     .access_key = "a", .secret_key = "s", .attempts = 1 };
	struct kiln_err err = { .code = "" };
	char long_bad[900];

	assert_int_equal(s3_put_buffer(&c, "r\xc3\xa9sum\xc3\xa9/\x1b[2J", "x", 1, NULL, &err), -1);
	assert_string_equal(err.code, "s3_error");
	assert_true(printable_ascii(err.message));
	assert_non_null(strstr(err.message, "r??sum?" "?/?[2J"));
	memset(long_bad, '\xff', sizeof(long_bad) - 2);
	long_bad[sizeof(long_bad) - 2] = '\n';
	long_bad[sizeof(long_bad) - 1] = '\0';
	assert_int_equal(s3_put_buffer(&c, long_bad, "x", 1, NULL, &err), -1);
	assert_true(printable_ascii(err.message));
	assert_non_null(strstr(err.message, "???..."));

	assert_int_equal(s3_put_buffer(&c, "k", "x", 1, "text/plain\r\nX-Evil: 1", &err), -1);
	assert_string_equal(err.code, "s3_error");
	assert_non_null(strstr(err.message, "Content-Type"));
	assert_int_equal(s3_put_buffer(&c, "k", "x", 1, "", &err), -1);
	assert_non_null(strstr(err.message, "Content-Type"));
	assert_int_equal(s3_put_file(&c, "a/../b", "/dev/null", NULL, NULL, NULL, &err), -1);
	assert_string_equal(err.code, "s3_error");
	assert_int_equal(s3_get_file(&c, "", "/tmp/never", &err), -1);
	assert_string_equal(err.code, "s3_error");
	assert_int_equal(s3_head(&c, "a//b", NULL, &err), -1);
	assert_string_equal(err.code, "s3_error");
	assert_int_equal(s3_delete(&c, "./x", &err), -1);
	assert_string_equal(err.code, "s3_error");

	/* And a valid call does reach the (closed) endpoint. */
	assert_int_equal(s3_head(&c, "k", NULL, &err), -1);
	assert_string_equal(err.code, "s3_unavailable");
	assert_non_null(strstr(err.message, "after 1 attempts"));
}

/* ---- XML text extraction ------------------------------------------------------- */

/* What Swift's s3api sends for a bad signature (abridged). */
static const char swift_403[] =
	"<?xml version='1.0' encoding='UTF-8'?>\n"
	"<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match "
	"the signature you provided. Check your key and signing method.</Message>"
	"<RequestId>tx642ff6000c55450689e93-006b102018</RequestId><AWSAccessKeyId>test:tester</AWSAccessKeyId>"
	"<CanonicalRequest>GET\n/kilntest/k\nX-Amz-Date=1&amp;X-Amz-Expires=60\nhost:127.0.0.1:8780</CanonicalRequest>"
	"</Error>";

static const char initiate[] =
	"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	"<InitiateMultipartUploadResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
	"<Bucket>kilntest</Bucket><Key>big40</Key>"
	"<UploadId>ZmQ2NzQ1ZjQtYjQ3OC00ZGE0LWE5ZGMtYjVlMDg1NWRhMjJj</UploadId>"
	"</InitiateMultipartUploadResult>";

static int xml(const char *doc, const char *tag, char *out, size_t n)
{
	return s3_xml_text(doc, strlen(doc), tag, out, n);
}

static void expect_text(const char *doc, const char *tag, const char *want)
{
	char out[512];
	int n = xml(doc, tag, out, sizeof(out));

	if (n < 0)
		fail_msg("no <%s> found in %s", tag, doc);
	assert_string_equal(out, want);
	assert_int_equal(n, (int)strlen(want));
}

static void expect_none(const char *doc, const char *tag)
{
	char out[64];

	memset(out, 'x', sizeof(out));
	if (xml(doc, tag, out, sizeof(out)) != -1)
		fail_msg("<%s> extracted from %s: \"%s\"", tag, doc, out);
	assert_string_equal(out, "");
}

static void test_xml_s3_replies(void **state)
{
	expect_text(swift_403, "Code", "SignatureDoesNotMatch");
	expect_text(swift_403, "Message", "The request signature we calculated does not match the signature "
					  "you provided. Check your key and signing method.");
	/* Entities decoded, line breaks flattened. */
	expect_text(swift_403, "CanonicalRequest", "GET /kilntest/k X-Amz-Date=1&X-Amz-Expires=60 host:127.0.0.1:8780");
	expect_text(initiate, "UploadId", "ZmQ2NzQ1ZjQtYjQ3OC00ZGE0LWE5ZGMtYjVlMDg1NWRhMjJj");
	expect_text(initiate, "Key", "big40");
	expect_none(initiate, "Code");
	expect_none(swift_403, "UploadId");
}

static void test_xml_element_matching(void **state)
{
	/* A longer tag with the same prefix is not the tag. */
	expect_text("<CodeX>no</CodeX><Code>yes</Code>", "Code", "yes");
	/* A closing tag alone is not an element. */
	expect_none("</Code>x</Code>", "Code");
	/* Attributes, and the first element wins. */
	expect_text("<Code a=\"1\">one</Code><Code>two</Code>", "Code", "one");
	expect_text("<Code\n>nl</Code>", "Code", "nl");
	/* Self-closing elements are skipped. */
	expect_text("<Code/><Code />< Code>x</Code><Code>real</Code>", "Code", "real");
	/* Empty text is found, with length 0. */
	expect_text("<Code></Code>", "Code", "");
	/* Case matters. */
	expect_none("<code>x</code>", "Code");
	/* Namespaced prefixes are other names. */
	expect_none("<s3:Code>x</s3:Code>", "Code");
}

static void test_xml_malformed(void **state)
{
	expect_none("<Code>unterminated", "Code");
	expect_none("<Code>x</Cod", "Code");
	expect_none("<Code>x</Codex>", "Code");
	expect_none("<Code>x</code>", "Code");
	expect_none("<Code", "Code");
	expect_none("<Code attr", "Code");
	expect_none("<Code>a<b>c</b></Code>", "Code");        /* markup inside */
	expect_none("<Code><![CDATA[x]]></Code>", "Code");    /* CDATA is not plain text */
	expect_none("<Code>x<!-- c --></Code>", "Code");
	expect_none("", "Code");
	expect_none("<", "Code");
	expect_none("<>", "Code");
	expect_none("<Code>x</Code>", "");
}

static void test_xml_entities_and_bytes(void **state)
{
	expect_text("<M>a &lt;b&gt; &amp; &quot;c&quot; &apos;d&apos;</M>", "M", "a <b> & \"c\" 'd'");
	expect_text("<M>&#65;&#x42;&#X43;</M>", "M", "ABC");
	/* References to non-printable characters, and unknown or broken entities. */
	expect_text("<M>&#0;&#10;&#x7f;&#x1F600;</M>", "M", "????");
	expect_text("<M>&nbsp;&#;&#x;&#12a;&amp</M>", "M", "&nbsp;&#;&#x;&#12a;&amp");
	expect_text("<M>&#99999999999999999999;</M>", "M", "&#99999999999999999999;");
	expect_text("<M>a&</M>", "M", "a&");
	/* Control and non-ASCII bytes never come out. */
	expect_text("<M>\x01\x1b[31m\x7f\xc3\xa9\x80\xff</M>", "M", "??[31m?????");
	expect_text("<M>t\tr\rn\n</M>", "M", "t r n ");
}

static void test_xml_bounds(void **state)
{
	char out[8], big[100];
	const char doc[] = "<Code>0123456789abcdef</Code>";
	char *huge;
	int n;

	/* Truncated to fit, NUL-terminated, full length returned. */
	memset(out, 'x', sizeof(out));
	n = s3_xml_text(doc, strlen(doc), "Code", out, sizeof(out));
	assert_int_equal(n, 16);
	assert_string_equal(out, "0123456");
	n = s3_xml_text(doc, strlen(doc), "Code", out, 1);
	assert_int_equal(n, 16);
	assert_string_equal(out, "");
	assert_int_equal(s3_xml_text(doc, strlen(doc), "Code", out, 0), -1);
	assert_int_equal(s3_xml_text(doc, strlen(doc), "Code", NULL, 8), -1);
	assert_int_equal(s3_xml_text(NULL, 10, "Code", out, sizeof(out)), -1);
	/* len is honoured: the document need not be NUL-terminated, and bytes
	 * past len are not looked at. */
	memcpy(big, "<Code>abc</Code>", 16);
	memset(big + 16, 'Z', sizeof(big) - 16);
	assert_int_equal(s3_xml_text(big, 16, "Code", out, sizeof(out)), 3);
	assert_string_equal(out, "abc");
	assert_int_equal(s3_xml_text(big, 15, "Code", out, sizeof(out)), -1);
	/* A NUL inside the text is a byte like any other (not the end). */
	assert_int_equal(s3_xml_text("<C>a\0b</C>", 10, "C", out, sizeof(out)), 3);
	assert_string_equal(out, "a?b");
	/* Tag length limits. */
	{
		char tag[70];

		memset(tag, 'T', 65);
		tag[65] = '\0';
		assert_int_equal(s3_xml_text(doc, strlen(doc), tag, out, sizeof(out)), -1);
	}
	/* Documents above S3_XML_MAX are refused without being scanned. */
	huge = malloc(S3_XML_MAX + 1);
	assert_non_null(huge);
	memset(huge, ' ', S3_XML_MAX + 1);
	memcpy(huge, "<Code>x</Code>", 14);
	assert_int_equal(s3_xml_text(huge, S3_XML_MAX + 1, "Code", out, sizeof(out)), -1);
	assert_int_equal(s3_xml_text(huge, S3_XML_MAX, "Code", out, sizeof(out)), 1);
	free(huge);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_encode_key),
		cmocka_unit_test(test_encode_key_all_bytes),
		cmocka_unit_test(test_canonical_query),
		cmocka_unit_test(test_canonical_query_limit),
		cmocka_unit_test(test_presign_aws_example),
		cmocka_unit_test(test_presign_path_style),
		cmocka_unit_test(test_presign_host),
		cmocka_unit_test(test_presign_rejects),
		cmocka_unit_test(test_refusals_before_network),
		cmocka_unit_test(test_xml_s3_replies),
		cmocka_unit_test(test_xml_element_matching),
		cmocka_unit_test(test_xml_malformed),
		cmocka_unit_test(test_xml_entities_and_bytes),
		cmocka_unit_test(test_xml_bounds),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
