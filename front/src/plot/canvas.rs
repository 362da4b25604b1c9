//! The bundled font, the layout of a line of text, and [`Canvas`]: plotters' bitmap backend with
//! its text set in that font.

use std::sync::OnceLock;

use ab_glyph::{Font, FontRef, Glyph, PxScale, ScaleFont, point};
use image::RgbImage;
use plotters::backend::BitMapBackend;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
// The backend's style traits are named by path only: in scope, their methods would clash with
// plotters' own `stroke_width` and `color`.
use plotters_backend::{BackendColor, BackendCoord, DrawingErrorKind};

use super::data::PlotError;
/// The family plotters' text styles name. Only their size, colour, anchor and turn are read:
/// [`Canvas`] sets every text in the bundled font, whatever the family.
const FAMILY: &str = "sans-serif";

pub(super) type Area<'a> = DrawingArea<Canvas<'a>, Shift>;

/// The bundled font, parsed once per process.
fn font() -> Result<&'static FontRef<'static>, PlotError> {
    static FONT: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    let font = FONT.get_or_init(|| FontRef::try_from_slice(dejavu::sans::regular()).ok());
    font.as_ref()
        .ok_or_else(|| PlotError::Draw("the bundled font did not load".into()))
}

/// `text` set on one line `size` px high (ascent to descent): its glyphs, positioned with the
/// top of the line at y = 0, and the line's width and height.
fn layout(font: &FontRef<'static>, size: f64, text: &str) -> (Vec<Glyph>, f32, f32) {
    let scaled = font.as_scaled(PxScale::from(size as f32));
    let (mut caret, mut previous) = (0.0, None);
    let mut glyphs = Vec::with_capacity(text.len());
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(previous) = previous {
            caret += scaled.kern(previous, id);
        }
        glyphs.push(id.with_scale_and_position(scaled.scale(), point(caret, scaled.ascent())));
        caret += scaled.h_advance(id);
        previous = Some(id);
    }
    (glyphs, caret, scaled.ascent() - scaled.descent())
}

/// plotters' bitmap backend with its text set by [`layout`] in the bundled font; every other
/// drawing call goes to the bitmap backend unchanged.
pub(super) struct Canvas<'a> {
    bitmap: BitMapBackend<'a>,
    font: &'static FontRef<'static>,
}

type Failure<'a> = DrawingErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>;

impl<'a> DrawingBackend for Canvas<'a> {
    type ErrorType = <BitMapBackend<'a> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.bitmap.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), Failure<'a>> {
        self.bitmap.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), Failure<'a>> {
        self.bitmap.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), Failure<'a>> {
        self.bitmap.draw_pixel(point, color)
    }

    fn draw_line<S: plotters_backend::BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.draw_line(from, to, style)
    }

    fn draw_rect<S: plotters_backend::BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: plotters_backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.draw_path(path, style)
    }

    fn draw_circle<S: plotters_backend::BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: plotters_backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), Failure<'a>> {
        self.bitmap.blit_bitmap(pos, size, src)
    }

    fn draw_text<S: plotters_backend::BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), Failure<'a>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let font = self.font;
        let (glyphs, width, height) = layout(font, style.size(), text);
        // The anchor's offset, before the text is turned about it.
        let dx = match style.anchor().h_pos {
            HPos::Left => 0.0,
            HPos::Center => -width / 2.0,
            HPos::Right => -width,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0.0,
            VPos::Center => -height / 2.0,
            VPos::Bottom => -height,
        };
        let turn = style.transform();
        let (w, h) = self.get_size();
        let mut result = Ok(());
        for mut glyph in glyphs {
            glyph.position.x += dx;
            glyph.position.y += dy;
            let Some(outline) = font.outline_glyph(glyph) else {
                continue;
            };
            let min = outline.px_bounds().min;
            outline.draw(|x, y, coverage| {
                if result.is_err() || coverage <= 0.0 {
                    return;
                }
                let (x, y) = turn.transform(min.x as i32 + x as i32, min.y as i32 + y as i32);
                let (x, y) = (pos.0 + x, pos.1 + y);
                if x >= 0 && y >= 0 && (x as u32) < w && (y as u32) < h {
                    let alpha = color.alpha * coverage.min(1.0) as f64;
                    let ink = BackendColor {
                        alpha,
                        rgb: color.rgb,
                    };
                    result = self.bitmap.draw_pixel((x, y), ink);
                }
            });
            if result.is_err() {
                break;
            }
        }
        result
    }

    fn estimate_text_size<S: plotters_backend::BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), Failure<'a>> {
        let (_, width, height) = layout(self.font, style.size(), text);
        Ok((width.ceil() as u32, height.ceil() as u32))
    }
}

/// A white `width`×`height` canvas handed to `draw`, returned as an image with what `draw`
/// returns.
pub(super) fn canvas<T>(
    width: u32,
    height: u32,
    draw: impl FnOnce(&Area<'_>) -> Result<T, PlotError>,
) -> Result<(RgbImage, T), PlotError> {
    let font = font()?;
    let mut buf = vec![255u8; width as usize * height as usize * 3];
    let out = {
        let bitmap = BitMapBackend::with_buffer(&mut buf, (width, height));
        let root = Canvas { bitmap, font }.into_drawing_area();
        let out = draw(&root)?;
        root.present()?;
        out
    };
    let img = RgbImage::from_raw(width, height, buf)
        .ok_or_else(|| PlotError::Draw("the canvas has the wrong size".into()))?;
    Ok((img, out))
}

pub(super) fn text(px: f64, colour: &RGBColor) -> TextStyle<'static> {
    (FAMILY, px).into_font().color(colour)
}

/// `style` anchored at the left end of the text, vertically centred.
pub(super) fn left_middle(style: TextStyle<'static>) -> TextStyle<'static> {
    style.pos(Pos::new(HPos::Left, VPos::Center))
}

/// The width in pixels of `s` set `px` high.
pub(super) fn measure(s: &str, px: f64) -> Result<i32, PlotError> {
    Ok(layout(font()?, px, s).1.ceil() as i32)
}
