// Image decoding: PNG (libpng), JPEG (libjpeg), other formats (stb_image), converted to RGB as PIL's
// convert("RGB") does. libpng and libjpeg report errors by longjmp; the functions that call setjmp
// hold only trivially destructible locals, so no destructor is skipped.
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include <jpeglib.h>
#include <png.h>
#include <stb/stb_image.h>

#include "support/Error.h"
#include "runtime/data/image/Image.h"

namespace dgemma {
namespace {

constexpr int64_t kMaxPixels = int64_t(1) << 28;  // refuses absurd sizes before allocating

// Pixels with `channels` interleaved 8-bit samples (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA) into RGB.
void toRgb(const uint8_t* src, int channels, int64_t count, uint8_t* dst) {
  for (int64_t i = 0; i < count; ++i, src += channels, dst += 3) {
    if (channels <= 2) {
      dst[0] = dst[1] = dst[2] = src[0];
    } else {
      dst[0] = src[0];
      dst[1] = src[1];
      dst[2] = src[2];
    }
  }
}

// A decoder's interleaved samples (1-4 channels) as an RGB image.
RgbImage rgbImageFrom(const uint8_t* samples, int channels, int64_t width, int64_t height) {
  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.resize(size_t(width * height * 3));
  toRgb(samples, channels, width * height, image.pixels.data());
  return image;
}

// ---- PNG ----

struct PngState {
  const std::vector<uint8_t>* bytes = nullptr;
  size_t position = 0;
  char message[256] = {0};
  std::vector<uint8_t> raw;           // decoded rows, `channels` samples per pixel
  std::vector<png_bytep> rows;
  png_uint_32 width = 0, height = 0;
  int channels = 0;
  bool tooLarge = false;
};

void pngRead(png_structp png, png_bytep out, png_size_t length) {
  auto* state = static_cast<PngState*>(png_get_io_ptr(png));
  if (state->bytes->size() - state->position < length) png_error(png, "unexpected end of file (truncated image)");
  std::memcpy(out, state->bytes->data() + state->position, length);
  state->position += length;
}

void pngError(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  png_longjmp(png, 1);
}

void pngWarning(png_structp, png_const_charp) {}

// Returns false with state->message set on failure.
bool decodePngRaw(PngState* state) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, state, pngError, pngWarning);
  if (png == nullptr) {
    std::snprintf(state->message, sizeof(state->message), "libpng initialization failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(state->message, sizeof(state->message), "libpng initialization failed");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, state, pngRead);
  png_read_info(png, info);
  state->width = png_get_image_width(png, info);
  state->height = png_get_image_height(png, info);
  if (int64_t(state->width) * int64_t(state->height) > kMaxPixels) {
    state->tooLarge = true;
    png_error(png, "image too large");
  }
  int colorType = png_get_color_type(png, info);
  int bitDepth = png_get_bit_depth(png, info);
  if (colorType == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (colorType == PNG_COLOR_TYPE_GRAY && bitDepth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bitDepth == 16) png_set_strip_16(png);  // PIL keeps the high byte of 16-bit RGB(A)
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  state->channels = png_get_channels(png, info);
  size_t rowBytes = png_get_rowbytes(png, info);
  if (state->channels < 1 || state->channels > 4 || rowBytes != size_t(state->width) * state->channels) {
    png_error(png, "unsupported PNG pixel layout");
  }
  state->raw.resize(rowBytes * state->height);
  state->rows.resize(state->height);
  for (png_uint_32 y = 0; y < state->height; ++y) state->rows[y] = state->raw.data() + size_t(y) * rowBytes;
  png_read_image(png, state->rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

RgbImage decodePng(const std::vector<uint8_t>& bytes, const std::string& path) {
  PngState state;
  state.bytes = &bytes;
  if (!decodePngRaw(&state)) {
    throw InputError(path + ": expected a PNG or JPEG image: invalid PNG: " + state.message);
  }
  return rgbImageFrom(state.raw.data(), state.channels, state.width, state.height);
}

// ---- JPEG ----

// Standard layout, `manager` first: libjpeg hands back a pointer to it.
struct JpegErrorManager {
  jpeg_error_mgr manager;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX + 64];
};

struct JpegState {
  JpegErrorManager error{};
  char* message = error.message;
  std::vector<uint8_t> raw;
  JDIMENSION width = 0, height = 0;
  int channels = 0;
};

void jpegErrorExit(j_common_ptr cinfo) {
  auto* error = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, error->message);
  std::longjmp(error->jump, 1);
}

// Warnings (premature end of data, corrupt entropy data) are errors: PIL refuses truncated JPEGs.
void jpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level < 0) jpegErrorExit(cinfo);
}

bool decodeJpegRaw(const std::vector<uint8_t>* bytes, JpegState* state) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&state->error.manager);
  state->error.manager.error_exit = jpegErrorExit;
  state->error.manager.emit_message = jpegEmitMessage;
  if (setjmp(state->error.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes->data(), static_cast<unsigned long>(bytes->size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_GRAYSCALE) {
    cinfo.out_color_space = JCS_GRAYSCALE;
  } else if (cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_RGB) {
    cinfo.out_color_space = JCS_RGB;
  } else {
    std::snprintf(state->message, sizeof(state->error.message), "unsupported JPEG color space (CMYK or YCCK)");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_start_decompress(&cinfo);
  state->width = cinfo.output_width;
  state->height = cinfo.output_height;
  state->channels = cinfo.output_components;
  if (int64_t(state->width) * int64_t(state->height) > kMaxPixels || state->channels < 1 || state->channels > 4) {
    std::snprintf(state->message, sizeof(state->error.message), "image too large or unsupported component count");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  size_t rowBytes = size_t(state->width) * state->channels;
  state->raw.resize(rowBytes * state->height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = state->raw.data() + size_t(cinfo.output_scanline) * rowBytes;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

RgbImage decodeJpeg(const std::vector<uint8_t>& bytes, const std::string& path) {
  JpegState state;
  if (!decodeJpegRaw(&bytes, &state)) {
    throw InputError(path + ": expected a PNG or JPEG image: invalid JPEG: " + state.message);
  }
  return rgbImageFrom(state.raw.data(), state.channels, state.width, state.height);
}

// ---- other formats ----

RgbImage decodeStb(const std::vector<uint8_t>& bytes, const std::string& path) {
  if (bytes.size() > size_t(INT32_MAX)) throw InputError(path + ": expected a PNG or JPEG image: file too large");
  int width = 0, height = 0, channels = 0;
  stbi_uc* data = stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &width, &height, &channels, 3);
  if (data == nullptr) {
    const char* reason = stbi_failure_reason();
    throw InputError(path + ": expected a PNG or JPEG image: unsupported or corrupt image (stb_image: " +
                     std::string(reason != nullptr ? reason : "unknown error") + ")");
  }
  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.assign(data, data + size_t(width) * size_t(height) * 3);
  stbi_image_free(data);
  return image;
}

}  // namespace

RgbImage decodeImage(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw InputError(path + ": expected a PNG or JPEG image: cannot open file: " + std::strerror(errno));
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) throw InputError(path + ": expected a PNG or JPEG image: read error");
  if (bytes.empty()) throw InputError(path + ": expected a PNG or JPEG image: empty file");

  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  RgbImage image;
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) {
    image = decodePng(bytes, path);
  } else if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
    image = decodeJpeg(bytes, path);
  } else {
    image = decodeStb(bytes, path);
  }
  if (image.width <= 0 || image.height <= 0) throw InputError(path + ": expected a PNG or JPEG image: empty image");
  return image;
}

}  // namespace dgemma
